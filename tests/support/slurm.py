"""A real single-node Slurm cluster (slurmctld, slurmd, munged on 127.0.0.1, private
ports, everything under one temp directory), started once per test process by
scripts/slurm/up and stopped by scripts/slurm/down. Tests that need it are skipped,
with the install command, where Slurm's daemons are not installed. A pytest plugin:
tests/conftest.py registers it (the `slurm_cluster` fixture)."""

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import waiting

ROOT = Path(__file__).resolve().parents[2]
NEEDED = ("slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo", "munged")
INSTALL = "apt-get install slurmctld slurmd slurm-client munge (as .ci/run does)"


@dataclass(frozen=True)
class Cluster:
    dir: Path
    conf: str

    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": self.conf}

    def run(self, *args: str, check: bool = True) -> str:
        done = subprocess.run(
            list(args), env=self.env(), capture_output=True, text=True, timeout=30
        )
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def jobs(self) -> dict[str, tuple[str, str]]:
        """Live jobs (pending, running, completing): id → (name, state)."""
        out = self.run("squeue", "-h", "-o", "%i|%j|%T")
        return {
            job_id: (name, state)
            for job_id, name, state in (line.split("|") for line in out.splitlines() if line)
        }

    def cancel_all(self) -> None:
        """Cancel every job and wait until squeue lists none (up to 15 s)."""
        ids = list(self.jobs())
        if ids:
            self.run("scancel", *ids, check=False)
        deadline = time.monotonic() + 15
        while self.jobs() and time.monotonic() < deadline:
            time.sleep(0.1)


@pytest.fixture(scope="session")
def slurm_cluster():
    missing = [name for name in NEEDED if shutil.which(name) is None]
    if missing:
        pytest.skip(f"no Slurm here ({', '.join(missing)} missing): {INSTALL}")
    up = subprocess.run(
        [str(ROOT / "scripts" / "slurm" / "up")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "SLURM_CI_SMOKE": "0"},
    )
    if up.returncode != 0:
        raise RuntimeError(f"scripts/slurm/up failed:\n{up.stderr}")
    directory = Path(up.stdout.strip())
    cluster = Cluster(dir=directory, conf=str(directory / "etc" / "slurm.conf"))
    try:
        yield cluster
    finally:
        subprocess.run(
            [str(ROOT / "scripts" / "slurm" / "down"), str(directory)],
            capture_output=True,
            timeout=120,
        )


def ours(cluster: Cluster, queue: str) -> dict[str, tuple[str, str]]:
    """The cluster's live jobs that are daemons of `queue`: id → (name, state)."""
    return {
        job: (name, state)
        for job, (name, state) in cluster.jobs().items()
        if name.startswith(f"lakeshore-{queue}-")
    }


def wait_for(condition, timeout=45.0, what="condition"):
    """wait_for with the time a Slurm job takes to start a daemon that registers."""
    waiting.wait_for(condition, timeout=timeout, what=what)
