"""refactor-pricing (scored all-or-nothing): the behaviour tests pass on the start state, the structure tests do not."""

import ast
import importlib

import pytest

CART = [{"price": 19.99, "qty": 3}, {"price": 0.35, "qty": 7}, {"price": 120.0, "qty": 1}]
PUBLIC = ("invoice_total", "quote_total", "refund_total")


@pytest.fixture
def pricing():
    return importlib.import_module("pricing")


@pytest.fixture
def tree(app):
    return ast.parse((app / "pricing.py").read_text(encoding="utf-8"))


def _functions(tree):
    return {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}


# Behaviour, as the start state computes it.

def test_invoice_total(pricing):
    assert pricing.invoice_total(CART) == 218.9
    assert pricing.invoice_total([]) == 0.0


def test_quote_total(pricing):
    assert pricing.quote_total(CART, 12.5) == 203.9
    assert pricing.quote_total(CART, 0) == 218.9


def test_refund_total(pricing):
    assert pricing.refund_total(CART) == -218.9
    assert pricing.refund_total([{"price": 1.0, "qty": 1}]) == -1.2


# Structure.

def test_helpers_exist_and_compute(pricing):
    assert pricing.subtotal(CART) == pytest.approx(182.42)
    assert pricing.subtotal([]) == 0
    assert pricing.with_tax(100) == 120.0
    assert pricing.with_tax(0.35) == 0.42


def test_public_functions_call_the_helpers_and_have_no_loop(tree):
    functions = _functions(tree)
    for name in PUBLIC:
        body = list(ast.walk(functions[name]))
        called = {node.func.id for node in body if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
        assert {"subtotal", "with_tax"} <= called, f"{name} calls {sorted(called)}"
        loops = [node for node in body if isinstance(node, (ast.For, ast.While, ast.comprehension))]
        assert not loops, f"{name} still has a loop"


def test_tax_rate_written_once(tree):
    rates = [node for node in ast.walk(tree) if isinstance(node, ast.Constant) and node.value == 0.2]
    assert len(rates) == 1, f"0.2 appears {len(rates)} times"
