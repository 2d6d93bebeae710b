"""SageMaker's sticky sessions across every API server process of the container.

mhcs's SessionManager (model-hosting-container-standards, which vLLM's SageMaker hooks use) keeps each session as a
folder under its sessions path, with the expiry in it, but looks sessions up in a dict of its own process, filled
from that folder only when the process starts. With more than one API server process (vLLM's api_server_count) a
request lands on whichever process the kernel hands its connection to, so a session made by one process would be
"not found" in the others, and one closed by one would stay open in the others.

`share_process_sessions` (the middleware calls it in each process) gives the process's manager a registry read from
the folder itself: a session exists while its folder does, whichever process made it. Only ids of the form mhcs
makes (UUID strings) name a folder, so a client's session header can never name a path outside it.

`check_session` makes, for an LMI body carrying the session header, the check vLLM's hooks make for OpenAI bodies.
"""
from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator, MutableMapping

# A folder without its expiry file yet, younger than this, is a session another process is making right now
# (mhcs makes the folder, then writes the expiry): it is left out of a sweep for expired sessions.
IN_THE_MAKING_S = 60.0
EXPIRY_FILE = ".expiration_ts"  # mhcs's name
SESSION_HEADER = "X-Amzn-SageMaker-Session-Id"


def session_id_of(name: object) -> str | None:
    """`name` when it is a session id as mhcs makes them (a UUID's canonical string), else None."""
    if not isinstance(name, str):
        return None
    try:
        return name if str(uuid.UUID(name)) == name else None
    except ValueError:
        return None


class SessionFolder(MutableMapping):
    """mhcs's session registry ({id: Session}) as the session folder holds it, shared by every process.

    Reading a session reads its folder. Adding one does nothing: SessionManager.create_session makes its folder
    right after. Deleting one does nothing: SessionManager.close_session has removed the folder first."""

    def __init__(self, root: str) -> None:
        self.root = root

    def _folder(self, session_id: object) -> str | None:
        sid = session_id_of(session_id)
        if sid is None:
            return None
        path = os.path.join(self.root, sid)
        return path if os.path.isdir(path) else None

    def __contains__(self, session_id: object) -> bool:
        return self._folder(session_id) is not None

    def __getitem__(self, session_id: str):
        from model_hosting_container_standards.sagemaker.sessions.manager import Session

        if session_id not in self:
            raise KeyError(session_id)
        return Session(session_id, self.root)  # reads the expiry from the folder

    def __setitem__(self, session_id: str, session) -> None:
        pass

    def __delitem__(self, session_id: str) -> None:
        pass

    def __iter__(self) -> Iterator[str]:
        try:
            names = sorted(os.listdir(self.root))
        except OSError:
            return iter(())
        return iter([n for n in names if n in self and not self._in_the_making(n)])

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def _in_the_making(self, session_id: str) -> bool:
        path = os.path.join(self.root, session_id)
        try:
            return (not os.path.exists(os.path.join(path, EXPIRY_FILE))
                    and time.time() - os.stat(path).st_mtime < IN_THE_MAKING_S)
        except OSError:  # removed meanwhile
            return True


def share_process_sessions() -> bool:
    """share_sessions for the manager of this process, the one vLLM's SageMaker hooks and the middleware use."""
    from model_hosting_container_standards.sagemaker.sessions.manager import get_session_manager

    return share_sessions(get_session_manager())


def share_sessions(manager) -> bool:
    """Give mhcs's session manager (None when sessions are off) the shared registry; True if it has it now."""
    if manager is None:
        return False
    if not isinstance(manager.sessions, SessionFolder):
        manager.sessions = SessionFolder(manager.sessions_path)
    return True


def check_session(raw_request) -> None:
    """An LMI body with SageMaker's session header: the same check vLLM's SageMaker hooks make for
    OpenAI bodies (sessions on, and the session known and not expired); LMIError naming the header if not."""
    if SESSION_HEADER not in raw_request.headers:
        return
    from fastapi.exceptions import HTTPException
    from model_hosting_container_standards.sagemaker.sessions.manager import get_session_manager
    from model_hosting_container_standards.sagemaker.sessions.utils import get_session

    from .errors import LMIError

    try:
        get_session(get_session_manager(), raw_request)
    except HTTPException as e:
        raise LMIError(f"{SESSION_HEADER}: {e.detail}", SESSION_HEADER) from None
    except ValueError as e:
        raise LMIError(f"{SESSION_HEADER}: {e}", SESSION_HEADER) from None
