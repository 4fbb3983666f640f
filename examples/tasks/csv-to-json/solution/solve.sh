#!/usr/bin/env bash
# Reference solution of csv-to-json (cwd /app): write the converter, then run it on the shipped inventory.
set -euo pipefail
cat > csv2json.py <<'PY'
"""csv2json IN.csv OUT.json: an inventory CSV (sku, name, qty, price, tags) as one JSON object."""

import csv
import json
import sys


class BadRow(ValueError):
    pass


def item(row, line):
    try:
        qty = int(row["qty"].strip())
    except ValueError:
        raise BadRow(f"line {line}: qty {row['qty']!r} is not a whole number") from None
    try:
        price = float(row["price"].strip())
    except ValueError:
        raise BadRow(f"line {line}: price {row['price']!r} is not a number") from None
    tags = [tag.strip() for tag in (row["tags"] or "").split(";")]
    return {"sku": row["sku"].strip(), "name": row["name"].strip(), "qty": qty, "price": price,
            "tags": [tag for tag in tags if tag]}


def convert(source, target):
    with open(source, encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(fh)
        items = []
        for row in reader:
            items.append(item(row, reader.line_num))
    items.sort(key=lambda entry: entry["sku"])
    total = round(sum(entry["qty"] * entry["price"] for entry in items), 2)
    with open(target, "w", encoding="utf-8") as fh:
        json.dump({"items": items, "count": len(items), "total_value": total}, fh, indent=2)
        fh.write("\n")


def main(argv):
    if len(argv) != 2:
        print("usage: csv2json.py IN.csv OUT.json", file=sys.stderr)
        return 2
    try:
        convert(*argv)
    except BadRow as exc:
        print(f"csv2json: {argv[0]} {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
PY
python3 csv2json.py data/inventory.csv data/inventory.json
