"""RUNNER=docker: who the steps run as, and the one place where the host gives them the folders they write into.

Every step of `make local-run RUNNER=docker` runs in its image as a user of its own, as on a cluster:
- the host is root: the images' non-root user (10001), never root, as the restricted Pod Security profile has it;
- the host is a user and the engine runs as root (Docker, rootful podman): that user's own IDs, so what the steps
  leave belongs to whoever ran make;
- the engine is rootless (podman or Docker): the container's root, which such an engine maps to the user who runs
  it (any other user inside is one of the user's subordinate IDs on the host, which may not write the user's
  folders). podman's `--userns=keep-id`, which would keep the user's own IDs inside, cannot be asked for through
  the Docker API that kfp.local speaks: the Docker SDK refuses any user namespace mode but `host`.

Before the first step the host makes (or takes over) every folder under the mounted output root that a step writes
into, through `StepUser.give`, and `StepUser.problems` checks the step user's access to everything the host
prepared (a test does the same with no engine), so a step never meets a folder it cannot write.
"""

from __future__ import annotations

import dataclasses
import os
import stat
from pathlib import Path

IMAGE_USER = 10001  # the images' user (images/Dockerfile)


@dataclasses.dataclass(frozen=True)
class StepUser:
    uid: int  # who the steps' files belong to on the host
    gid: int

    @property
    def docker_user(self) -> str:
        return f"{self.uid}:{self.gid}"

    def run_arguments(self) -> dict[str, str]:
        """The user argument of docker's containers.run."""
        return {"user": self.docker_user}

    def may_write(self, folder: Path) -> bool:
        """Whether this user may create and remove entries in `folder` (write and search permission)."""
        return may_write(folder.stat(), self.uid, {self.gid})

    def give(self, folder: Path, recursive: bool = False) -> None:
        """Make `folder` (and its parents) if needed and let this user write into it (with `recursive`, into every
        folder and file below too). The host's own user already may; root hands the folder over (and keeps every
        right over it); another user cannot, and the step user's access is then checked by `problems`."""
        folder.mkdir(parents=True, exist_ok=True)
        if os.getuid() == self.uid or os.getuid() != 0:
            return
        paths = [folder]
        if recursive:
            paths += [Path(root) / name for root, folders, files in os.walk(folder) for name in (*folders, *files)]
        for path in paths:
            if not path.is_symlink():
                os.chown(path, self.uid, self.gid)

    def problems(self, root: Path, recursive: bool = True) -> list[str]:
        """The folders at `root` (and, with `recursive`, below it) that this user could not write into, as lines."""
        found = []
        for current, folders, _files in os.walk(root):
            candidates = [Path(current)] if current == str(root) else []
            candidates += [Path(current) / name for name in folders] if recursive else []
            for path in candidates:
                info = path.lstat()
                if not stat.S_ISLNK(info.st_mode) and not may_write(info, self.uid, {self.gid}):
                    found.append(
                        f"{path} (owner {info.st_uid}:{info.st_gid}, mode {stat.filemode(info.st_mode)}) is not "
                        f"writable by the steps' user {self.docker_user}"
                    )
            if not recursive:
                break
            folders[:] = [name for name in folders if not (Path(current) / name).is_symlink()]
        return found


def may_write(info: os.stat_result, uid: int, gids: set[int]) -> bool:
    """POSIX permission bits for creating entries in a folder: write and search, for owner, group or others."""
    if uid == 0:
        return True
    if info.st_uid == uid:
        bits = stat.S_IWUSR | stat.S_IXUSR
    elif info.st_gid in gids:
        bits = stat.S_IWGRP | stat.S_IXGRP
    else:
        bits = stat.S_IWOTH | stat.S_IXOTH
    return info.st_mode & bits == bits


def step_user_for(rootless: bool, host_uid: int | None = None, host_gid: int | None = None) -> StepUser:
    """The user the steps run as (see the module's description), with the host's IDs for the host's files."""
    uid = os.getuid() if host_uid is None else host_uid
    gid = os.getgid() if host_gid is None else host_gid
    if rootless:
        return RootlessEngineUser(uid, gid)
    if uid == 0:
        return StepUser(IMAGE_USER, IMAGE_USER)
    return StepUser(uid, gid)


@dataclasses.dataclass(frozen=True)
class RootlessEngineUser(StepUser):
    """A rootless engine (podman or Docker): the container's root is the host user `uid`, whose files the steps then
    write."""

    @property
    def docker_user(self) -> str:
        return "0:0"


def engine_is_rootless(info: dict) -> bool:
    """Whether the engine that answered `docker info` runs without root: rootless Docker says so among its security
    options, rootless podman's Docker API in a field of its own (`Rootless`, seen with podman 4.3)."""
    return info.get("Rootless") is True or any(
        "rootless" in str(option) for option in info.get("SecurityOptions") or []
    )
