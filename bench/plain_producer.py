"""A plain Kafka producer in its own process, for the soak bench: generated valid ClickEvents at a
steady rate with the Java client's defaults: `linger.ms` 5 (the source system's generator),
so the broker gets many small batches. Writes `partition offset produced_at` per delivered record.

python -m bench.plain_producer BOOTSTRAP TOPIC --rate 200 --records 12000 [--linger-ms 5] [--out F]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from jobs.gendata.generator import generate_records, produce

    parser = argparse.ArgumentParser(prog="python -m bench.plain_producer")
    parser.add_argument("bootstrap")
    parser.add_argument("topic")
    parser.add_argument("--rate", type=float, required=True, help="records per second")
    parser.add_argument("--records", type=int, required=True)
    parser.add_argument("--linger-ms", type=int, default=5)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--out", type=Path, help="where to write the deliveries (none: not kept)")
    args = parser.parse_args(argv)
    props = {
        "bootstrap.servers": args.bootstrap,
        "linger.ms": args.linger_ms,
        "acks": "all",
        # Java's KafkaProducer default. librdkafka's (1,000,000) lets ~100 requests pile up on one
        # connection, and tansu then leaves some unanswered until the 60 s request timeout.
        "max.in.flight.requests.per.connection": 5,
    }
    delivered: list[tuple[int, int, float]] = []
    events = generate_records(args.records, args.seed, start_ms=int(time.time() * 1000))
    summary = produce(
        props, args.topic, events, args.records, args.rate,
        on_delivered=(lambda p, o, at: delivered.append((p, o, at))) if args.out else None,
    )  # fmt: skip
    if args.out:
        args.out.write_text("".join(f"{p} {o} {at:.6f}\n" for p, o, at in delivered))
    if summary.failed:
        raise SystemExit(f"{summary.failed} of {args.records} records not delivered")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
