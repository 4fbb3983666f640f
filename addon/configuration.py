"""The polar_* options: declared in `load`, parsed together in `configure`, then applied by the parts that own what
they configure (`services`: the control token, the flow writer, the backend), and by this addon for the rest (the
provider hosts, exact mode, the call settings).

They are one concern, not one per part, because they fail together (docs/options.md): parse everything before
changing anything — a failure must leave no half-applied state behind — and any bad value fails the whole gateway
closed (providers get their 503). A bad value is one error line naming the option, never an exception out of
`configure`: setting mitmproxy's own options re-enters configure, and an OptionsError there made mitmproxy roll back
and re-run it without end (issue 13). At start-up mitmdump exits on that error line (its errorcheck addon), so the
line says so instead of "failing closed".

Two kinds of `--set` never reach `configure` as values: ones mitmproxy cannot parse for the type (`polar_exact=yes`,
which would abort the script's load without a word) and `polar_*` names no option has (a typo mitmproxy keeps
deferred and never mentions). `load` takes both out as errors of our own; they stay errors until a restart.
"""

from __future__ import annotations

import asyncio
import logging

from mitmproxy import ctx

from . import hosts as hostlist
from .announce import Announcer
from .call import CallSettings
from .control import TokenFileError
from .exact import ExactMode
from .exact_cache import TurnCache
from .gateway import GatewayAddon
from .options import BY_NAME, OPTIONS, GatewayOptions, OptionError, parse_options, take_unparseable, unknown_options

log = logging.getLogger("polar.gateway")


class Configuration(GatewayAddon):
    def __init__(self, gateway, *parts) -> None:
        super().__init__(gateway)
        self.parts = parts  # each has apply(new, old), called in this order; the first may refuse without a trace
        self._unparseable: dict[str, OptionError] = {}

    def load(self, loader) -> None:
        for option in OPTIONS:
            loader.add_option(option.name, option.typespec, option.default, option.help)
        options = loader.master.options
        self._unparseable = {**unknown_options(getattr(options, "deferred", {})),
                             **take_unparseable(options, BY_NAME)}

    def configure(self, updated: set[str]) -> None:
        g = self.gateway
        try:
            self._apply(self._parse())
        except (OptionError, OSError) as exc:
            self._fail(str(exc) if isinstance(exc, (OptionError, TokenFileError)) else f"polar_flows: {exc}")
        else:
            if g.failure is not None:
                log.info("polar gateway: options valid again, serving")
            g.failure = None

    def _parse(self) -> GatewayOptions:
        if self._unparseable:  # never applied, so it stays an error until the proxy is restarted
            raise next(iter(self._unparseable.values()))
        return parse_options({name: getattr(ctx.options, name) for name in BY_NAME})

    def _apply(self, o: GatewayOptions) -> None:
        g = self.gateway
        old = g.options
        for part in self.parts:
            part.apply(o, old)
        if o.exact:
            if g.exact is None or old is None or o.exact_cache_bytes != old.exact_cache_bytes:
                g.exact = ExactMode(TurnCache(max_bytes=o.exact_cache_bytes))
        else:
            g.exact = None
        g.hosts = o.hosts
        g.settings = CallSettings(
            max_body_bytes=o.max_body_bytes, connect_timeout=o.connect_timeout,
            first_byte_timeout=o.first_byte_timeout, idle_timeout=o.idle_timeout, logprobs_mode=o.logprobs_mode,
            thinking_kwarg=o.thinking_kwarg, sampling_override=o.sampling_override, exact=g.exact,
            control=g.control, announce=self._announcer(o, old),
        )
        g.options = o

    def _announcer(self, o: GatewayOptions, old: GatewayOptions | None):
        """The call announcer polar_announce asks for: the current one while its URL, hold and token stay."""
        g = self.gateway
        current = g.settings.announce if g.settings is not None else None
        token = g.control_server.token.decode() if g.control_server.token is not None else None
        if o.announce is None or token is None:
            return None
        if current is not None and (current.url, current.hold_s, current.token) == (o.announce, o.announce_hold, token):
            return current
        return Announcer(o.announce, token, o.announce_hold)

    def _fail(self, line: str) -> None:
        g = self.gateway
        if line != g.failure:
            if not g.started and ctx.master.addons.get("errorcheck") is not None:
                # mitmdump exits on an error logged at start-up: say that, and keep its exit to this one line.
                log.error("polar gateway: %s; the proxy exits (a bad option at start-up)", line)
                logging.getLogger("asyncio").addFilter(_drop_cancelled)
            else:  # later (or without errorcheck) the proxy keeps answering 503
                log.error("polar gateway: %s; failing closed (provider requests get 503)", line)
        g.failure = line
        g.hosts = hostlist.fail_closed_hosts(getattr(ctx.options, "polar_hosts", ()))


def _drop_cancelled(record: logging.LogRecord) -> bool:
    """mitmdump's exit cancels the connection a readiness probe has open at that moment, and asyncio logs that
    task's CancelledError as ~40 lines of traceback after our one line; nothing in it is news."""
    exc = record.exc_info[1] if record.exc_info else None
    return not isinstance(exc, asyncio.CancelledError)
