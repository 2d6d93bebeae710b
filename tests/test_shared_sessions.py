"""SageMaker's sessions shared by every API server process (serving/lmi/sessions.py), no engine: two of mhcs's own
SessionManagers on one session folder are two API server processes' managers."""
from __future__ import annotations

import os
import time
import uuid

import pytest
from model_hosting_container_standards.sagemaker.sessions.manager import SessionManager

from serving.lmi.sessions import IN_THE_MAKING_S, SessionFolder, session_id_of, share_sessions


def managers(root, shared=True, expiration=1200):
    out = [SessionManager({"sessions_path": str(root), "sessions_expiration": str(expiration)}) for _ in range(2)]
    if shared:
        assert all(share_sessions(m) for m in out)
    return out


def test_without_the_shared_registry_a_process_does_not_know_the_others_sessions(tmp_path):
    """mhcs alone: what the shared registry fixes."""
    a, b = managers(tmp_path, shared=False)
    made = a.create_session()
    with pytest.raises(ValueError, match="session not found"):
        b.get_session(made.session_id)


def test_a_session_made_by_one_process_is_served_and_closed_by_the_other(tmp_path):
    a, b = managers(tmp_path)
    made = a.create_session()
    got = b.get_session(made.session_id)
    assert got.session_id == made.session_id and got.expiration_ts == pytest.approx(made.expiration_ts)
    got.put("turns", 3)  # the session's data: one folder, read by both
    assert a.get_session(made.session_id).get("turns") == 3
    b.close_session(made.session_id)
    assert not (tmp_path / made.session_id).exists()
    for m in (a, b):
        with pytest.raises(ValueError, match="session not found"):
            m.get_session(made.session_id)
        with pytest.raises(ValueError, match="session not found"):
            m.close_session(made.session_id)


def test_an_expired_session_is_gone_for_every_process(tmp_path):
    a, b = managers(tmp_path, expiration=1)
    made = a.create_session()
    time.sleep(1.1)
    assert b.get_session(made.session_id) is None  # expired: closed, its folder removed
    assert not (tmp_path / made.session_id).exists()
    with pytest.raises(ValueError, match="session not found"):
        a.get_session(made.session_id)


def test_a_new_session_sweeps_every_process_expired_sessions_but_not_one_being_made(tmp_path):
    a, b = managers(tmp_path, expiration=1)
    old = a.create_session()
    being_made = tmp_path / str(uuid.uuid4())  # another process between its mkdir and its expiry file
    being_made.mkdir()
    stray = tmp_path / str(uuid.uuid4())  # an expiry file never came: swept once older than IN_THE_MAKING_S
    stray.mkdir()
    os.utime(stray, (time.time() - IN_THE_MAKING_S - 1,) * 2)
    time.sleep(1.1)
    new = b.create_session()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([new.session_id, being_made.name])
    assert old.session_id not in b.sessions and new.session_id in a.sessions


@pytest.mark.parametrize("name", ["../outside", "/etc", "..", "", "NEW_SESSION",
                                  str(uuid.uuid4()).upper(), "{%s}" % uuid.uuid4(), 42])
def test_only_an_id_mhcs_makes_names_a_folder(tmp_path, name):
    """A client's session header is never a path: nothing but a UUID's canonical string is looked up."""
    root = tmp_path / "sessions"
    root.mkdir()
    (tmp_path / "outside").mkdir()
    if not str(name).startswith("/"):
        (root / str(name).lower().strip("{}")).mkdir(exist_ok=True)  # where the name would lead if it were a path
    folder = SessionFolder(str(root))
    assert session_id_of(name) is None
    assert name not in folder
    with pytest.raises(KeyError):
        folder[name]
    a, _ = managers(root)
    if name not in ("NEW_SESSION", ""):  # mhcs answers those with None before any lookup
        with pytest.raises(ValueError, match="session not found"):
            a.get_session(name)


def test_sessions_off_leave_nothing_to_share():
    assert share_sessions(None) is False
