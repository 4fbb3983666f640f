"""The fail-closed answer is each codec's own "unavailable" answer, byte for byte (no sockets)."""

from __future__ import annotations

import orjson
import pytest

from polar.addon.codecs import ROUTERS
from polar.addon.codecs.base import GatewayError
from polar.addon.provider_errors import unavailable

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("codec", ROUTERS, ids=lambda c: c.PROTOCOL)
def test_1_1_unavailable_is_the_codecs_own_shape(codec):
    status, content_type, body = unavailable(codec.PROTOCOL, "polar gateway failed to load")
    want_status, want_body = codec.error_response(GatewayError("unavailable", "polar gateway failed to load"))
    assert (status, orjson.loads(body)) == (want_status, orjson.loads(want_body))
    assert content_type == codec.JSON_CONTENT_TYPE


def test_1_2_a_host_no_codec_serves_gets_openais_shape():
    status, _, body = unavailable(None, "down")
    assert status == 503 and orjson.loads(body)["error"]["code"] == "service_unavailable"
