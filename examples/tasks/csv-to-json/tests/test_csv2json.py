"""csv-to-json: every test needs csv2json.py or data/inventory.json, which the start state lacks."""

import json
import subprocess
import sys

import pytest

HEADER = "sku,name,qty,price,tags\n"


@pytest.fixture
def convert(app, tmp_path):
    def run(csv_text):
        (tmp_path / "in.csv").write_text(csv_text, encoding="utf-8")
        done = subprocess.run([sys.executable, str(app / "csv2json.py"), "in.csv", "out.json"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=20)
        out = tmp_path / "out.json"
        return done, (json.loads(out.read_text(encoding="utf-8")) if out.exists() else None)
    return run


def test_shipped_inventory_converted(app):
    got = json.loads((app / "data" / "inventory.json").read_text(encoding="utf-8"))
    assert got == {
        "items": [
            {"sku": "A-020", "name": "Allen key set", "qty": 3, "price": 12.5, "tags": ["tools", "metric"]},
            {"sku": "A-100", "name": "Anchor plug", "qty": 40, "price": 0.35, "tags": ["hardware"]},
            {"sku": "B-200", "name": "Bolt, hex M6", "qty": 120, "price": 0.15, "tags": ["hardware", "metric"]},
            {"sku": "C-310", "name": "Cable tie", "qty": 500, "price": 0.02, "tags": []},
        ],
        "count": 4,
        "total_value": 79.5,
    }


def test_types_and_order(convert):
    done, got = convert(HEADER + "z9,Zip,2,1.25,\nm1,Mop,10,4,home\n")
    assert done.returncode == 0, done.stderr
    assert [item["sku"] for item in got["items"]] == ["m1", "z9"]
    assert all(type(item["qty"]) is int for item in got["items"])
    assert [item["price"] for item in got["items"]] == [4, 1.25]


def test_quoted_fields_and_spaces(convert):
    done, got = convert(HEADER + 'k1,"  Nuts, bolts and ""washers""  ", 7 ,0.5,x\n')
    assert done.returncode == 0, done.stderr
    assert got["items"][0]["name"] == 'Nuts, bolts and "washers"'
    assert got["items"][0]["qty"] == 7


def test_tags_split_and_cleaned(convert):
    done, got = convert(HEADER + "a,A,1,1,red; blue;;green ;\nb,B,1,1,\n")
    assert done.returncode == 0, done.stderr
    assert [item["tags"] for item in got["items"]] == [["red", "blue", "green"], []]


def test_columns_in_any_order_and_extra_columns_ignored(convert):
    done, got = convert("price,colour,tags,sku,qty,name\n2.5,red,t,s1,4,Saw\n")
    assert done.returncode == 0, done.stderr
    assert got["items"] == [{"sku": "s1", "name": "Saw", "qty": 4, "price": 2.5, "tags": ["t"]}]


def test_count_and_total_value(convert):
    done, got = convert(HEADER + "a,A,3,0.1,\nb,B,7,0.7,\nc,C,0,99,\n")
    assert done.returncode == 0, done.stderr
    assert (got["count"], got["total_value"]) == (3, 5.2)


def test_header_only_gives_no_items(convert):
    done, got = convert(HEADER)
    assert done.returncode == 0, done.stderr
    assert got == {"items": [], "count": 0, "total_value": 0}


def test_bad_number_exits_1_naming_the_line(convert):
    for row in ("b,B,lots,1.0,", "b,B,2.5,1.0,", "b,B,2,cheap,"):
        done, got = convert(HEADER + "a,A,1,1.0,\n" + row + "\n")
        assert done.returncode == 1 and got is None, row
        assert "line 3" in done.stderr, (row, done.stderr)
