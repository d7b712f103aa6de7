"""The deployment files: the image runs unprivileged, and compose.yaml exposes
nothing, metrics included, beyond its internal network; Redis has a user per role."""

from __future__ import annotations

from pathlib import Path

from tests.support import ROOT


def test_the_image_runs_as_an_unprivileged_user_owning_the_data_dir() -> None:
    lines = (ROOT / "Dockerfile").read_text().splitlines()
    users = [line.split()[1].split(":")[0] for line in lines if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0"), "the last USER runs the service"
    assert any("chown" in line and "/data" in line for line in lines), "the data dir is that user's"


def test_compose_keeps_every_service_and_the_metrics_on_an_internal_network() -> None:
    import yaml

    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    internal = {name for name, network in compose.get("networks", {}).items() if (network or {}).get("internal")}
    for name, service in compose["services"].items():
        assert "ports" not in service, f"{name} publishes a port on the host"
        networks = set(service.get("networks", []))
        # Metrics on 0.0.0.0 are safe only where every network the container joins is internal.
        assert networks and networks <= internal, f"{name} joins a network that is not internal: {networks}"


def test_compose_runs_redis_with_a_user_per_role_and_gives_the_service_its_url_as_a_secret() -> None:
    """No client holds the keys to everything. Redis loads the ACL file `engram acl
    --write secrets` makes (default user off); the workers read the service role's URL from a
    secret; no password sits in compose.yaml or in a container's environment."""
    import yaml

    from engram_ledger.services.ops import acl

    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    secret_files = {name: Path(secret["file"]).name for name, secret in compose["secrets"].items()}
    redis = compose["services"]["redis"]
    command = redis["command"]
    aclfile = command[command.index("--aclfile") + 1]
    assert aclfile.startswith("/run/secrets/") and aclfile.removeprefix("/run/secrets/") in redis["secrets"]
    assert secret_files[aclfile.removeprefix("/run/secrets/")] == acl.ACL_FILE
    assert acl.PREAMBLE[1].split()[1] in redis["healthcheck"]["test"], "the health check logs in as its PING-only user"
    for name, service in compose["services"].items():
        environment = service.get("environment") or {}
        assert not any("@" in str(value) for value in environment.values()), f"{name}: credentials in the environment"
        if name.startswith("engram"):
            assert "ENGRAM_REDIS_URL" not in environment and "REDIS_URL" not in environment, name
            secret = environment["ENGRAM_REDIS_URL_FILE"].removeprefix("/run/secrets/")
            assert secret in service["secrets"] and secret_files[secret] == acl.url_file("service"), name
