"""The sandbox's object store: a real S3 API server (moto's, in memory) that checks signatures.

moto and its botocore need a python-dateutil older than the kubernetes client allows, so the
server runs from its own virtual environment in the user's cache, built once. The server starts
with authentication off for exactly the calls that create its one IAM user (allowed s3:*) and
that user's access key; every later request must be signed with that key, which `up` writes as
an AWS shared credentials file (the form spec.model.secretRef holds for an s3:// source). The
client is the real AWS CLI v2 (Debian's awscli), which the sandbox also runs for the
`amazon/aws-cli` image. Objects live as long as the server: a restart empties the store.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from llmfleet_sandbox.config import SandboxConfig

REQUIREMENTS = ("moto[s3,iam]==5.2.5", "flask==3.1.3", "flask-cors==6.0.5")
AWS_CLI = "/usr/bin/aws"  # Debian's awscli package (v2), installed by `make`
USER = "sandbox"
REGION = "us-east-1"
POLICY = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
# The calls made before authentication starts: create-user, put-user-policy, create-access-key.
SETUP_CALLS = 3


class ObjectStoreError(RuntimeError):
    pass


def _progress(message: str) -> None:
    print(f"[sandbox] {message}", file=sys.stderr, flush=True)


def environment_dir() -> Path:
    cache = os.environ.get("LLMFLEET_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache"), "llmfleet")
    digest = hashlib.sha256("\n".join(REQUIREMENTS).encode()).hexdigest()[:12]
    return Path(cache) / f"object-store-{digest}"


def ensure_environment() -> Path:
    """The server's Python (built on first use, then reused from the cache). Sandboxes started
    side by side (the e2e workers on a fresh machine) share the cache: under a lock (flock, held
    until the file closes) one builds and the others wait for it and reuse what it built."""
    venv = environment_dir()
    python = venv / "bin" / "python"
    installed = venv / ".installed"
    if installed.exists():
        return python
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.with_name(venv.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if installed.exists():
            return python
        _progress(f"installing the S3 server ({', '.join(REQUIREMENTS)}) into {venv}")
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        result = subprocess.run([str(python), "-m", "pip", "install", "-q", *REQUIREMENTS],
                                capture_output=True, text=True)
        if result.returncode != 0:
            shutil.rmtree(venv, ignore_errors=True)
            raise ObjectStoreError(f"installing the S3 server failed:\n{result.stderr.strip()[-2000:]}")
        installed.touch()
    return python


def argv(config: SandboxConfig, python: Path) -> list[str]:
    return [str(python), "-m", "moto.server", "-H", config.network.gateway_ip, "-p", str(config.ports.object_store)]


def server_env() -> dict[str, str]:
    return {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(SETUP_CALLS)}


def aws_env(config: SandboxConfig, credentials_file: Path | None = None) -> dict[str, str]:
    """The AWS CLI's environment for this store (its user's credentials file unless given)."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(config.state_dir / "object-store"),
            "AWS_SHARED_CREDENTIALS_FILE": str(credentials_file or config.object_store_credentials_file),
            "AWS_CONFIG_FILE": "/dev/null", "AWS_DEFAULT_REGION": REGION, "AWS_PAGER": ""}


def aws(config: SandboxConfig, *args: str, credentials_file: Path | None = None) -> str:
    """Run the AWS CLI against the store; its stdout. ObjectStoreError carries its stderr.
    (Debian's CLI predates AWS_ENDPOINT_URL: the endpoint is a flag.)"""
    result = subprocess.run([AWS_CLI, "--endpoint-url", config.object_store_url, *args],
                            env=aws_env(config, credentials_file), capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        raise ObjectStoreError(f"aws {' '.join(args[:2])}: {result.stderr.strip()}")
    return result.stdout


def provision(config: SandboxConfig) -> None:
    """Create the store's user and key (the only unauthenticated calls) and write the key as a
    credentials file; from here on every request is checked against it."""
    directory = config.object_store_credentials_file.parent
    directory.mkdir(parents=True, exist_ok=True)
    setup = directory / "setup-credentials"
    # Unsigned calls still need some key to sign with; the server ignores it until auth starts.
    setup.write_text("[default]\naws_access_key_id = setup\naws_secret_access_key = setup\n")
    aws(config, "iam", "create-user", "--user-name", USER, credentials_file=setup)
    aws(config, "iam", "put-user-policy", "--user-name", USER, "--policy-name", "s3",
        "--policy-document", json.dumps(POLICY), credentials_file=setup)
    key = json.loads(aws(config, "iam", "create-access-key", "--user-name", USER,
                         credentials_file=setup))["AccessKey"]
    setup.unlink()
    config.object_store_credentials_file.write_text(
        f"[default]\naws_access_key_id = {key['AccessKeyId']}\naws_secret_access_key = {key['SecretAccessKey']}\n")
    config.object_store_credentials_file.chmod(0o600)
