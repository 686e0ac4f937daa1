"""The local broker's start waits until it answers, not only until it listens (lakehouse/local/broker.py).

A stand-in process takes tansu's place: it listens on the broker's port (so `up` sees a listener)
and its command line names tansu (so the pid file is ours); what it answers is the test's.
"""

from __future__ import annotations

import sys
import textwrap

import pytest
from confluent_kafka import KafkaException

from lakehouse.local import broker as broker_module
from lakehouse.local.broker import Broker
from lakehouse.local.process import StackError
from lakehouse.local.settings import StackSettings


class _NoStore:
    def client_env(self, _secrets):
        return {}


@pytest.fixture
def broker(tmp_path, monkeypatch):
    stand_in = tmp_path / "tansu"
    stand_in.write_text(
        textwrap.dedent(
            f"""\
            #!{sys.executable}
            import socket, sys, time
            port = int(sys.argv[sys.argv.index("--listener-url") + 1].rsplit(":", 1)[1])
            server = socket.socket()
            server.bind(("127.0.0.1", port))
            server.listen()
            time.sleep(float(open({str(tmp_path / "lives")!r}).read()))
            """
        )
    )
    stand_in.chmod(0o755)
    monkeypatch.setattr(broker_module, "_tansu_binary", lambda: str(stand_in))
    settings = StackSettings.on_free_ports(tmp_path / "home")
    started = Broker(settings, object_store=_NoStore())
    yield started, tmp_path / "lives"
    started.stop()


def test_up_waits_for_a_broker_that_resets_its_first_metadata_requests(broker, monkeypatch) -> None:
    started, lives = broker
    lives.write_text("60")
    answers = iter([KafkaException("Broker transport failure"), KafkaException("reset"), True])

    def answer(self) -> bool:
        reply = next(answers)
        if isinstance(reply, Exception):
            raise reply
        return reply

    topics = []
    monkeypatch.setattr(Broker, "answers", answer)
    monkeypatch.setattr(Broker, "ensure_topic", lambda self, topic, partitions: topics.append(topic))

    started.start({})

    assert topics == ["clicktopic"] and next(answers, "all used") == "all used"


def test_a_broker_that_dies_after_listening_is_one_error_with_its_log(broker, monkeypatch) -> None:
    started, lives = broker
    lives.write_text("1")

    def never(self) -> bool:
        raise KafkaException("Broker transport failure")

    monkeypatch.setattr(Broker, "answers", never)

    with pytest.raises(StackError, match=r"tansu exited while starting\. Log .*tansu\.log"):
        started.start({})


def test_up_over_a_running_broker_also_waits_until_it_answers(broker, monkeypatch) -> None:
    """A second `up` while the broker an earlier one started is still warming up."""
    started, lives = broker
    lives.write_text("60")
    answers = iter([True, KafkaException("Broker transport failure"), True])

    def answer(self) -> bool:
        reply = next(answers)
        if isinstance(reply, Exception):
            raise reply
        return reply

    monkeypatch.setattr(Broker, "answers", answer)
    monkeypatch.setattr(Broker, "ensure_topic", lambda self, topic, partitions: None)
    started.start({})
    pid = started.process.pid()

    started.start({})  # running: not started again, but asked until it answers

    assert started.process.pid() == pid and next(answers, "all used") == "all used"
