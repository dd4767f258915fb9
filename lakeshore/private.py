"""Files and directories only their owner reads (issue 17): the server's secret key,
auth.yml, var/. A private file is created 0600 in one step (`os.open` with a mode,
O_EXCL), under any umask, and renamed or linked into place: no moment exists when it
has another mode or half its text. No Django here: the CLI and `make run` use it too."""

import contextlib
import os
import secrets
import struct
from pathlib import Path

FILE_MODE = 0o600
DIR_MODE = 0o700


# A POSIX ACL (the system.posix_acl_access attribute's binary form): entries of
# (tag, permissions, id), tags in this order.
ACL_XATTR = "system.posix_acl_access"
_USER_OBJ, _USER, _GROUP_OBJ, _MASK, _OTHER = 0x01, 0x02, 0x04, 0x10, 0x20
_NO_ID = 0xFFFFFFFF
_ENTRY = struct.Struct("<HHI")


def private_dir(path: Path, *, traverse: tuple[int, ...] = ()) -> Path:
    """`path` as a directory only its owner enters (0700), made so or made so again.

    `traverse`: users (uids) who may also pass through it to what they own below
    (execute only: they cannot list it or open anything there not theirs), through a
    POSIX ACL that keeps the users it let through before; its mask shows as the group's
    execute bit (0710), the owning group and others still get nothing."""
    path = Path(path)
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    status = path.stat()
    if status.st_uid != os.geteuid():
        return path  # not ours to change
    users = set(traverse) | passers(path)
    if users:
        entries = [(_USER_OBJ, 7, _NO_ID), *((_USER, 1, uid) for uid in sorted(users))]
        entries += [(_GROUP_OBJ, 0, _NO_ID), (_MASK, 1, _NO_ID), (_OTHER, 0, _NO_ID)]
        acl = struct.pack("<I", 2) + b"".join(_ENTRY.pack(*entry) for entry in entries)
        try:
            os.setxattr(path, ACL_XATTR, acl)  # mode and ACL in one step
        except OSError:  # a filesystem without POSIX ACLs: everyone may pass, none list
            path.chmod(0o711)
    elif status.st_mode & 0o077:
        path.chmod(DIR_MODE)
    return path


def passers(path: Path) -> set[int]:
    """The users `path`'s ACL names (those private_dir let through)."""
    try:
        raw = os.getxattr(path, ACL_XATTR)
    except OSError:  # no ACL, or none supported here
        return set()
    entries = (_ENTRY.unpack_from(raw, at) for at in range(4, len(raw) - 7, _ENTRY.size))
    return {uid for tag, _, uid in entries if tag == _USER}


def _draft(path: Path, text: str) -> Path:
    """A new file next to `path`, created 0600 and holding `text`."""
    draft = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(draft, flags, FILE_MODE)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
    except BaseException:
        draft.unlink(missing_ok=True)
        raise
    return draft


def write_private(path: Path, text: str) -> Path:
    """Replaces `path` with a 0600 file holding `text` (atomically)."""
    path = Path(path)
    draft = _draft(path, text)
    try:
        os.replace(draft, path)
    except BaseException:
        draft.unlink(missing_ok=True)
        raise
    return path


def create_private(path: Path, text: str) -> bool:
    """Creates `path` as a 0600 file holding `text` unless it exists: processes racing
    to create it all keep the first one's text (it is linked into place whole).
    True if this call created it."""
    path = Path(path)
    draft = _draft(path, text)
    try:
        os.link(draft, path)
    except FileExistsError:
        return False
    finally:
        with contextlib.suppress(FileNotFoundError):
            draft.unlink()
    return True
