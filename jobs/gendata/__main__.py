"""`lakehouse gendata`: produce ClickEvents (and, on request, malformed records) to Kafka."""

from __future__ import annotations

import argparse
import sys

from jobs.common.job_args import (
    JobArgumentParser,
    add_environment_args,
    config_from_args,
    reports_config_errors,
)
from jobs.gendata.generator import generate_records, produce, producer_config


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = JobArgumentParser(prog="lakehouse gendata", description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, required=True, help="records to send")
    parser.add_argument("--rate", type=float, help="events per second (default: as fast as possible)")
    parser.add_argument("--seed", type=int, help="same seed -> same records")
    parser.add_argument("--bad-ratio", type=float, default=0.0, help="share of malformed records (0..1)")
    parser.add_argument("--start-ms", type=int, help="event time of the first record (default: now)")
    parser.add_argument("--step-ms", type=int, default=1, help="event time step with --start-ms")
    parser.add_argument("--topic", help="default from config (clicktopic)")
    parser.add_argument("--bootstrap", help="override the config's bootstrap servers")
    parser.add_argument("--manifest", help="write partition,offset,kind of each delivered record (CSV)")
    parser.add_argument("--no-progress", action="store_true")
    add_environment_args(parser)
    args = parser.parse_args(argv)
    if not 0 <= args.bad_ratio <= 1:
        parser.error("--bad-ratio must be between 0 and 1")
    return args


@reports_config_errors
def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    args = parse_args(sys.argv[1:] if argv is None else argv)
    config = config_from_args(args)
    topic = args.topic or config.kafka.topic
    records = generate_records(args.count, args.seed, args.bad_ratio, args.start_ms, args.step_ms)
    summary = produce(
        producer_config(config, args.bootstrap),
        topic,
        records,
        args.count,
        args.rate,
        record_deliveries=bool(args.manifest),
        progress=not args.no_progress and sys.stderr.isatty(),
    )
    if args.manifest:
        with open(args.manifest, "w") as handle:
            handle.write("partition,offset,kind\n")
            handle.writelines(f"{p},{o},{k}\n" for p, o, k in sorted(summary.delivered))
    Console(stderr=True).print(
        f"sent={summary.sent} failed={summary.failed} elapsed={summary.elapsed_seconds:.1f}s "
        f"rate={summary.rate:,.0f} events/s topic={topic}"
    )
    return 0 if summary.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
