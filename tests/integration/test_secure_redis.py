"""Redis with TLS and an ACL user (the default user switched off): the service and the client
connect through a ``rediss://user:password@host:port/0?ssl_ca_certs=...`` URL, the form README's
Security section documents; a wrong password is refused with a clear error."""

from __future__ import annotations

import datetime
import ipaddress
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.services.adapters.redis_server import find_redis_server, free_port
from engram_ledger.services.bus.client import EngramClient
from tests.conftest import RunningService, service_settings
from tests.support import redis_with_password, wait_until

PASSWORD = "s3cret-for-tests"


def write_certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1, signed by it."""
    now = datetime.datetime.now(datetime.UTC)

    def certificate(subject: str, key, issuer: str, issuer_key, ca: bool) -> x509.Certificate:  # type: ignore[no-untyped-def]
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
            )
        return builder.sign(issuer_key, hashes.SHA256())

    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = certificate("engram test CA", ca_key, "engram test CA", ca_key, ca=True)
    server = certificate("127.0.0.1", server_key, "engram test CA", ca_key, ca=False)
    paths = directory / "ca.crt", directory / "server.crt", directory / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        server_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return paths


@pytest.fixture
def secure_redis(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    ca, cert, key = write_certificates(tmp_path)
    port = free_port()
    process = subprocess.Popen(
        [
            find_redis_server(),
            "--port", "0",
            "--tls-port", str(port),
            "--bind", "127.0.0.1",
            "--tls-cert-file", str(cert),
            "--tls-key-file", str(key),
            "--tls-ca-cert-file", str(ca),
            "--tls-auth-clients", "no",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(tmp_path),
            # An ACL user for Engram; the password-less default user is off.
            "--user", "default", "off",
            "--user", "engram", "on", f">{PASSWORD}", "~*", "&*", "+@all",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"rediss://engram:{PASSWORD}@127.0.0.1:{port}/0?ssl_ca_certs={ca}"

    def answering() -> bool:
        try:
            with redis.Redis.from_url(url) as client:
                return bool(client.ping())
        except redis.RedisError:
            return False

    wait_until(answering, timeout=30, what="the TLS redis-server answering")
    yield port, ca
    process.terminate()
    process.wait(10)


async def test_the_service_and_its_clients_work_over_tls_with_an_acl_user(secure_redis: tuple[int, Path]) -> None:
    port, ca = secure_redis
    url = f"rediss://engram:{PASSWORD}@127.0.0.1:{port}/0?ssl_ca_certs={ca}"
    service = await RunningService(service_settings(url, index_enabled=False)).start()
    try:
        async with EngramClient(url, timeout=10) as client:
            saved = await client.save("alice", "My passport expires in March", advise=False)
            listing = await client.list_notes("alice", after=saved.token)
            assert [n.content for n in listing.notes] == ["My passport expires in March"]

        wrong = f"rediss://engram:not-the-password@127.0.0.1:{port}/0?ssl_ca_certs={ca}"
        with pytest.raises(EngramError) as refused:
            await EngramClient(wrong, timeout=2).connect()
        assert refused.value.code == ErrorCode.UNAVAILABLE and "password" in str(refused.value).lower()

        plain = f"redis://engram:{PASSWORD}@127.0.0.1:{port}/0"
        with pytest.raises(EngramError):
            await EngramClient(plain, timeout=2).connect()  # no TLS: the server does not answer
    finally:
        await service.stop()


async def test_the_clients_errors_show_the_url_without_its_password(tmp_path: Path) -> None:
    with redis_with_password(tmp_path, PASSWORD) as port:
        wrong = f"redis://engram:typo-of-{PASSWORD}@127.0.0.1:{port}/0"
        with pytest.raises(EngramError) as refused:
            await EngramClient(wrong, timeout=2).connect()
        assert refused.value.code == ErrorCode.UNAVAILABLE
        assert f"redis://engram:***@127.0.0.1:{port}/0" in refused.value.message
        assert PASSWORD not in refused.value.message

        # The right password, and no service has run there yet.
        with pytest.raises(EngramError) as never:
            await EngramClient(f"redis://:{PASSWORD}@127.0.0.1:{port}/0", timeout=2).connect()
        assert (
            never.value.message
            == f"no Engram service has ever run on redis://:***@127.0.0.1:{port}/0; start `engram serve`"
        )
