"""`python -m kcl_pipeline.local` — the local AWS emulators alone, in the foreground, printing `export` lines.

`kcl-pipeline local up` runs them too, with the demo stream, its producer and the demo's whole environment."""
from __future__ import annotations

import argparse
import sys

from kcl_pipeline.local.emulators import (
    DEFAULT_LOG_DIR,
    DEFAULT_REGION,
    SERVICES,
    EmulatorError,
    run_stack_foreground,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kcl_pipeline.local", description=__doc__)
    parser.add_argument("--log-dir", default=str(DEFAULT_LOG_DIR),
                        help="where each emulator logs (default %(default)s)")
    parser.add_argument("--services", default=",".join(SERVICES), help="comma-separated subset of %(default)s")
    parser.add_argument("--region", default=DEFAULT_REGION)
    parser.add_argument("--slow-resharding", action="store_true",
                        help="keep kinesis-local's AWS-like CREATING/UPDATING durations (default: immediate)")
    parser.add_argument("--kinesis-port", type=int, default=0)
    parser.add_argument("--dynamodb-port", type=int, default=0)
    parser.add_argument("--moto-port", type=int, default=0, help="S3 and CloudWatch")
    parser.add_argument("--env-file", help="also write the export lines to this file")
    args = parser.parse_args(argv)
    ports = {"kinesis": args.kinesis_port, "dynamodb": args.dynamodb_port, "moto": args.moto_port}
    try:
        return run_stack_foreground(
            args.log_dir,
            services=[s.strip() for s in args.services.split(",") if s.strip()],
            fast_resharding=not args.slow_resharding,
            region=args.region,
            ports={k: v for k, v in ports.items() if v},
            env_file=args.env_file,
        )
    except (EmulatorError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
