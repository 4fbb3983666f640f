"""polar.launch: the services' lifecycle — the proxy (one or a fleet) and vLLM, their run files, the CA bundle,
publication of new weights (hold → reload → release), process identity.

It imports only the standard library and polar.records (and the addon's option table, to refuse a bad --set before a
start: docs/architecture.md#the-floors), so it runs in the proxy's environment (Python 3.12), the
trainer's (3.11) and from a wheel without a checkout. The command lines (`polar-proxy`, `polar-vllm`, and the
checkout's `scripts/proxy`, `scripts/vllm`) are thin wrappers over these functions.

- `paths`: where things live — the checkout when there is one, else flags and environment variables; the one-line
  message that names what is missing.
- `process`: process identity (`is_ours`: alive, not a zombie, the marker in its command line), ports, process groups.
- `runfiles`: `ProxyRunFile`, `VllmRunFile` — the only code that reads or writes proxy.json and vllm.json.
- `ca`: the CA (created 0700/0600 before any proxy starts) and the one CA bundle (system CAs + ours).
- `proxy`, `proxy_cli`: start/stop/status/health/env of the gateway (mitmdump -s polar/addon/polar_addon.py).
- `vllm` (the facade over `vllm_args`, `vllm_server`, `vllm_pool`), `vllm_cli`, `vllm_launcher`: start/stop/status/
  health of a vLLM OpenAI server or a pool of them (CPU build where no GPU).
- `publish`: `publish(backends, weights, version)` — hold the proxies once, reload and probe every backend, release.
"""
