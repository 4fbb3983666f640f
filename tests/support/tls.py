"""Test-only TLS material and a way to make the `polar` package unimportable in a child process."""

from __future__ import annotations

import datetime
import os


def self_signed(directory, name: str = "localhost") -> tuple[str, str]:
    """A self-signed certificate for `name` (usable as its own CA) and its key: (cert path, key path)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = os.path.join(str(directory), f"{name}.pem"), os.path.join(str(directory), f"{name}.key")
    with open(cert_path, "wb") as fh:
        fh.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(key_path, "wb") as fh:
        fh.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                   serialization.NoEncryption()))
    return cert_path, key_path


def polar_import_blocker(directory) -> dict:
    """Environment for child processes in which mitmdump cannot `import polar…` (a sitecustomize on PYTHONPATH).
    Only mitmdump: the command that starts it (scripts/proxy) is itself the polar package."""
    blocker = os.path.join(str(directory), "blocker")
    os.makedirs(blocker, exist_ok=True)
    with open(os.path.join(blocker, "sitecustomize.py"), "w") as fh:
        fh.write("import sys\n"
                 "class _Block:\n"
                 "    def find_spec(self, name, path=None, target=None):\n"
                 "        if name == 'polar' or name.startswith('polar.'):\n"
                 "            raise ImportError('blocked for the fail-closed test')\n"
                 "if sys.argv and sys.argv[0].endswith('mitmdump'):\n"
                 "    sys.meta_path.insert(0, _Block())\n")
    return dict(os.environ, PYTHONPATH=blocker)
