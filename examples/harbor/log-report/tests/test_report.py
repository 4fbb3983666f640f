import collections
import re
from pathlib import Path

LOG = Path("/app/access.log")
REPORT = Path("/app/report.txt")
LINE = re.compile(r'^\S+ \S+ \S+ \[[^\]]+\] "[^"]*" (\d{3}) ')


def expected() -> list[str]:
    counts = collections.Counter(LINE.match(line).group(1) for line in LOG.read_text().splitlines() if line)
    return [f"{code} {counts[code]}" for code in sorted(counts)]


def test_report_exists():
    assert REPORT.is_file()


def test_report_counts():
    assert REPORT.read_text().splitlines() == expected()
