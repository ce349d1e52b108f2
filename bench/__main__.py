"""Pluto's benchmarks: ``python -m bench [--quick] [--only SECTION ...]``.

Every figure is printed beside a baseline measured in the same run (these machines are noisy:
the ratio holds, an absolute time does not), and all of them are written to
``bench/results/latest.json``.
"""

from __future__ import annotations

import argparse
import time

from bench.common import Report

SECTIONS = ("startup", "roundtrip", "streaming", "statements", "memory", "data", "python",
            "cluster", "schedules", "slowloris", "voice")


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--quick", action="store_true", help="smaller loads (a smoke run)")
    p.add_argument("--only", nargs="+", choices=SECTIONS, help="run only these sections")
    args = p.parse_args()
    report = Report()
    t0 = time.monotonic()
    for section in args.only or SECTIONS:
        print(f"\n== {section}", flush=True)
        match section:
            case "startup":
                from bench import startup
                startup.run(report)
            case "roundtrip":
                from bench import roundtrip
                roundtrip.run(report, quick=args.quick)
            case "streaming":
                from bench import streaming
                streaming.run(report, quick=args.quick)
            case "statements":
                from bench import statements
                statements.run(report, quick=args.quick)
            case "memory":
                from bench import memory
                memory.run(report, quick=args.quick)
            case "data":
                from bench import data
                data.run(report, quick=args.quick)
            case "python":
                from bench import python
                python.run(report, quick=args.quick)
            case "cluster":
                from bench import cluster
                cluster.run(report, quick=args.quick)
            case "schedules":
                from bench import schedules
                schedules.run(report, quick=args.quick)
            case "slowloris":
                from bench import slowloris
                slowloris.run(report, quick=args.quick)
            case "voice":
                from bench import voice
                voice.run(report, quick=args.quick)
    path = report.write()
    missed = [f for f in report.figures if f.met is False]
    print(f"\n{len(report.figures)} figures in {time.monotonic() - t0:.0f} s, written to {path}")
    for f in missed:
        print(f"target missed: {f.section} / {f.name}: {f.target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
