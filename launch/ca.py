"""The proxy's CA as agents need it: our certificate alone (for variables that ADD to a store, NODE_EXTRA_CA_CERTS)
and the CA bundle, the system CAs plus ours (for variables that REPLACE the default store, SSL_CERT_FILE and
REQUESTS_CA_BUNDLE).

The bundle has one name, `ca-bundle-<hash>.pem` (a hash of its content), and is written once per content: two users
with different CAs or system stores never overwrite each other's file, and a bundle an agent already points at never
changes under it. Also: the CA itself, made once in a new confdir. Standard library only (mitmproxy to make a CA).
"""

from __future__ import annotations

import hashlib
import os
import ssl
import subprocess

from polar.records.files import write_atomic

SYSTEM_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem")
CA_CERT = "mitmproxy-ca-cert.pem"  # public: what agents trust
KEY_FILES = ("mitmproxy-ca.pem", "mitmproxy-ca.p12")  # the CA's private key
BUNDLE_PREFIX = "ca-bundle-"


def _is_bundle(path: str) -> bool:
    # One of our own bundles (SSL_CERT_FILE left over from an earlier `eval`): never the "system" store.
    return os.path.basename(path).startswith(BUNDLE_PREFIX)


def system_bundle() -> str | None:
    """The system CA store file: OpenSSL's compiled-in default first (not $SSL_CERT_FILE, which may be ours)."""
    paths = ssl.get_default_verify_paths()
    for path in (paths.openssl_cafile, paths.cafile, *SYSTEM_BUNDLES):
        if path and os.path.isfile(path) and not _is_bundle(path):
            return path
    return None


def bundle_bytes(ca_pem: str) -> bytes:
    """The system CAs plus ours."""
    with open(ca_pem, "rb") as fh:
        ours = fh.read()
    system = b""
    sysb = system_bundle()
    if sysb:
        with open(sysb, "rb") as fh:
            system = fh.read().rstrip() + b"\n"
    return system + ours


def bundle(ca_pem: str, out_dir: str) -> str:
    """`bundle_bytes(ca_pem)` as `out_dir/ca-bundle-<hash>.pem`, written only when no file has that content yet;
    returns its path."""
    data = bundle_bytes(ca_pem)
    out = os.path.join(out_dir, f"{BUNDLE_PREFIX}{hashlib.sha256(data).hexdigest()[:16]}.pem")
    if not os.path.isfile(out):
        os.makedirs(out_dir, exist_ok=True)
        write_atomic(out, data)
    return out


def ca_cert(confdir: str) -> str:
    return os.path.join(confdir, CA_CERT)


_MAKE_CA = "import sys; from mitmproxy.certs import CertStore; CertStore.from_store(sys.argv[1], 'mitmproxy', 2048)"


def ensure_ca(confdir: str, python: str | None = None) -> bool:
    """Make the CA in `confdir` when it has none (once, before any proxy starts: a fleet started on an empty confdir
    would otherwise mint one CA per process). The directory is 0700 and the key files 0600 either way. True when a
    new CA was made; RuntimeError when it could not be (`python`: an interpreter with mitmproxy)."""
    made = False
    os.makedirs(confdir, mode=0o700, exist_ok=True)
    if not os.path.isfile(ca_cert(confdir)):
        try:
            from mitmproxy.certs import CertStore
        except ImportError:
            if not python:
                raise RuntimeError(f"no CA in {confdir}, and mitmproxy (which makes one) is not importable here")
            proc = subprocess.run([python, "-c", _MAKE_CA, confdir], capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"making a CA in {confdir} failed: {proc.stderr.strip()[-300:]}") from None
        else:
            CertStore.from_store(confdir, "mitmproxy", 2048)
        made = True
    for path, mode in [(confdir, 0o700)] + [(os.path.join(confdir, name), 0o600) for name in KEY_FILES]:
        if os.path.exists(path) and os.stat(path).st_mode & 0o077:  # only what is too open: it may not be ours
            os.chmod(path, mode)
    return made
