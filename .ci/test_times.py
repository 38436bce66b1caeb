"""Print each test directory's times from a run (tests/run_report.py's JSON) next to its
budget in the README, flagging the directories over it."""

import json
import re
import sys
from pathlib import Path


def budget(readme: str) -> dict[str, float]:
    table = re.search(r"<!-- test-budget -->(.*?)<!-- /test-budget -->", readme, re.S)
    rows = re.findall(r"^\|\s*([\w-]+)\s*\|\s*([\d.]+)\s*\|$", table.group(1) if table else "", re.M)
    return {name: float(minutes) for name, minutes in rows}


def main(times_file: str, readme_file: str) -> None:
    times = json.loads(Path(times_file).read_text())
    limits = budget(Path(readme_file).read_text())
    for name, spent in times.items():
        busy, limit = spent["busy"] / 60, limits.get(name)
        verdict = "no budget in the README" if limit is None else (
            f"OVER its budget of {limit:g} min" if busy > limit else f"budget {limit:g} min")
        print(f"  {name:<12} {spent['wall'] / 60:5.1f} min wall, {busy:5.1f} min in its "
              f"{spent['tests']} tests ({verdict})")


if __name__ == "__main__":
    main(*sys.argv[1:3])
