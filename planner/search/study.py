"""Persistent Optuna studies at in-memory speed: storages, a local mirror with batched writes, Ctrl-C.

Optuna's RDB storage commits every ``suggest_*``, user attribute and state change of a trial on its own
(about 20 transactions per trial through the SQLAlchemy ORM): a 200-trial search on ``sqlite:///F.db``
took 11.4 s against 1.1 s in memory on the 2-core dev machine (issue 16). :class:`MirroredStudy` runs the
trials on an in-memory study that mirrors the persistent one and writes each finished trial to the
storage in batches, at most :data:`FLUSH_S` apart: RDB URLs (SQLite, PostgreSQL, MySQL) in one transaction
of plain inserts into Optuna's own tables (:func:`_insert_trials`; trial numbers assigned under the same
study-row lock Optuna takes), journal files through Optuna's own API. Each flush also reads the trials
other processes finished since the last one into the mirror, so workers sharing a study see each other's
trials (how Optuna users share one study between processes); only finished trials are ever written, so
a killed or interrupted process leaves nothing RUNNING and loses at most the last FLUSH_S of trials, which
``--resume`` re-runs with the same per-trial seeds (planner.search.samplers).
"""

from __future__ import annotations

import inspect
import json
import os
import signal
import socket
import threading
import time
from datetime import timezone

from costmodel.core.errors import PlannerError

FLUSH_S = 0.5
"""Longest time finished trials wait in memory before they are written (a crash loses at most this much
search work; the writes cost about 1 ms per trial batched, 15 ms each one by one through the ORM)."""
FLUSH_ENV = "PLANNER_STUDY_FLUSH_S"
"""Overrides FLUSH_S (seconds; 0 writes every trial as it finishes: tests/test_search.py's crash tests)."""
OWNER_ATTR = "planner_owner"
"""Trial user attribute ``host:pid`` of the process that evaluated it."""
RDB_SCHEMES = ("sqlite", "postgresql", "postgres", "mysql", "mariadb", "oracle", "mssql")


def open_storage(url: str | None):
    """An Optuna storage from a URL: None = in memory; ``journal:PATH`` = journal file (NFS-safe file
    locking, for shared filesystems); sqlite/postgresql/mysql URLs = RDB storage."""
    if url is None:
        return None
    import optuna  # deferred: Optuna takes about half a second to import

    url = url.strip()
    if url.startswith("journal:"):
        path = url[len("journal:"):]
        path = path[2:] if path.startswith("//") else path
        if not path:
            raise PlannerError("--storage journal: needs a file path, e.g. journal:./planner.journal.")
        from optuna.storages.journal import JournalFileBackend, JournalStorage  # deferred: Optuna

        try:
            return JournalStorage(JournalFileBackend(path))
        except OSError as exc:
            raise PlannerError(f"cannot open journal file {path!r} ({exc.strerror}); check the path.") from None
    scheme = url.split("://", 1)[0].split("+", 1)[0].lower() if "://" in url else ""
    if scheme not in RDB_SCHEMES:
        raise PlannerError(f"--storage {url!r} is not a storage URL; use sqlite:///FILE.db, journal:FILE, or an "
                           "RDB URL such as postgresql://user@host/db.")
    kwargs = {"connect_args": {"timeout": 60}} if scheme == "sqlite" else {}
    for attempt in range(6):
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs=kwargs, heartbeat_interval=None)
        except Exception as exc:  # sqlalchemy / driver errors: one line, no traceback
            msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            # several processes creating the schema of one new database race; the loser retries
            if attempt < 5 and any(k in msg for k in ("already exists", "locked", "UNIQUE constraint",
                                                      "duplicate key")):
                time.sleep(0.2 * (attempt + 1))
                continue
            raise PlannerError(f"cannot open --storage {url!r} ({msg}); check the URL and that the database "
                               "is reachable.") from None


def owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _process_gone(who: str) -> bool:
    """True when ``who`` (``host:pid``) is a process of this host that no longer exists."""
    host, _, pid = who.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False  # another machine's trial (or a foreign one): cannot tell, leave it
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def recover_stale_trials(study) -> int:
    """Trials left RUNNING by a killed process of this host (studies written before trials were mirrored,
    or by other Optuna code): mark them failed and queue their parameters again. Returns how many."""
    import optuna  # deferred: Optuna takes about half a second to import

    n = 0
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        who = t.user_attrs.get(OWNER_ATTR)
        if not isinstance(who, str) or not _process_gone(who):
            continue
        study.tell(t.number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
        if t.params:
            study.enqueue_trial(dict(t.params), user_attrs={"planner_recovered_from": t.number})
        n += 1
    return n


def _rdb_trials(rdb, study_id: int, states, included: set, greater_than: int) -> list:
    """Finished trials of ``study_id`` whose id is in ``included`` or above ``greater_than``, through Optuna's
    private RDB reader: newer optuna (5.0) takes (states, included_trial_ids, trial_id_greater_than), optuna 4.0
    (states, excluded_trial_ids) and returns every trial in ``states`` (filtered here)."""
    params = inspect.signature(rdb._get_trials).parameters
    if "trial_id_greater_than" in params:
        return rdb._get_trials(study_id, states, included, greater_than)
    return [t for t in rdb._get_trials(study_id, states, set())
            if t._trial_id > greater_than or t._trial_id in included]


def _rdb(storage):
    """The RDBStorage behind ``storage`` (Optuna wraps it in a cache), or None."""
    import optuna  # deferred: Optuna takes about half a second to import

    inner = getattr(storage, "_backend", storage)
    return inner if isinstance(inner, optuna.storages.RDBStorage) else None


def _insert_trials(rdb, study_id: int, trials: list, after_id: int) -> tuple[list[int], list[int]]:
    """Write finished ``trials`` in one transaction as plain inserts into Optuna's tables (the rows
    ``RDBStorage.create_new_trial(template_trial=...)`` writes, without the ORM's per-row queries).
    The study row is locked first, as Optuna does, so trial numbers stay unique across processes.
    Returns the new trial ids and those of the trials other processes finished past ``after_id``."""
    from optuna import distributions  # deferred: Optuna
    from optuna.storages._rdb import models  # deferred: Optuna
    from optuna.trial import TrialState  # deferred: Optuna
    from sqlalchemy import func, insert, select  # deferred: SQLAlchemy comes with Optuna's RDB storage

    tm = models.TrialModel.__table__
    with rdb.engine.begin() as conn:
        conn.execute(select(models.StudyModel.__table__.c.study_id)
                     .where(models.StudyModel.__table__.c.study_id == study_id).with_for_update())
        params, values, uattrs, sattrs = [], [], [], []
        ids = []
        for t in trials:
            tid = conn.execute(insert(tm).values(
                study_id=study_id, number=None, state=t.state,
                datetime_start=_utc(t.datetime_start), datetime_complete=_utc(t.datetime_complete))
            ).inserted_primary_key[0]
            ids.append(tid)
            for name, v in t.params.items():
                dist = t.distributions[name]
                params.append({"trial_id": tid, "param_name": name, "param_value": dist.to_internal_repr(v),
                               "distribution_json": distributions.distribution_to_json(dist)})
            for obj, v in enumerate(t.values or []):
                stored, kind = models.TrialValueModel.value_to_stored_repr(v)
                values.append({"trial_id": tid, "objective": obj, "value": stored, "value_type": kind})
            uattrs += [{"trial_id": tid, "key": k, "value_json": json.dumps(v)} for k, v in t.user_attrs.items()]
            sattrs += [{"trial_id": tid, "key": k, "value_json": json.dumps(v)} for k, v in t.system_attrs.items()]
        for model, rows in ((models.TrialParamModel, params), (models.TrialValueModel, values),
                            (models.TrialUserAttributeModel, uattrs), (models.TrialSystemAttributeModel, sattrs)):
            if rows:
                conn.execute(insert(model.__table__), rows)
        base = conn.execute(select(func.count()).select_from(tm).where(
            tm.c.study_id == study_id, tm.c.trial_id < min(ids))).scalar_one()
        later = sorted(conn.execute(select(tm.c.trial_id).where(tm.c.study_id == study_id,
                                                                tm.c.trial_id >= min(ids))).scalars())
        number = {tid: base + i for i, tid in enumerate(later)}
        for tid in ids:
            conn.execute(tm.update().where(tm.c.trial_id == tid).values(number=number[tid]))
        mine = set(ids)
        others = [t for t in conn.execute(select(tm.c.trial_id).where(
            tm.c.study_id == study_id, tm.c.trial_id > after_id,
            tm.c.state.in_((TrialState.COMPLETE, TrialState.PRUNED)))).scalars() if t not in mine]
    return ids, others


def _utc(dt):
    """A naive local datetime as the naive UTC RDBStorage stores."""
    if dt is None:
        return None
    return dt.astimezone(timezone.utc).replace(tzinfo=None)


class MirroredStudy:
    """A study run in memory and written to a persistent storage in batches (module docstring).

    ``local`` is the study the sampler and the objective use; ``remote`` the persistent one (None in
    memory: then ``local`` is the only study and nothing is written)."""

    def __init__(self, storage, study_name: str | None, directions: list[str], sampler):
        import optuna  # deferred: Optuna takes about half a second to import

        self.remote = None
        if storage is not None:
            self.remote = optuna.create_study(study_name=study_name, storage=storage, directions=directions,
                                              load_if_exists=True)
        self.local = optuna.create_study(sampler=sampler, directions=directions)
        self._finished = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
        self._pending: list = []
        self._written: set[int] = set()  # remote trial ids of this process or already mirrored
        self._last_id = -1
        self._last_flush = time.perf_counter()
        try:
            self._flush_s = float(os.environ.get(FLUSH_ENV, FLUSH_S))
        except ValueError:
            raise PlannerError(f"{FLUSH_ENV} must be a number of seconds, e.g. 0.5.") from None
        self._rdb = _rdb(self.remote._storage) if self.remote is not None else None

    @property
    def attrs_study(self):
        """Where study attributes (the problem, the run's budget) live."""
        return self.remote if self.remote is not None else self.local

    def load(self) -> None:
        """Mirror the storage's finished trials (call after :func:`recover_stale_trials`)."""
        if self.remote is not None:
            self._pull()

    def _pull(self, others: list[int] | None = None) -> None:
        """Add trials other processes finished since the last pull to the mirror (``others``: their ids past
        the last seen one, when an RDB write just listed them)."""
        storage, sid = self.remote._storage, self.remote._study_id
        if self._rdb is not None:
            if others is not None and not others:
                return
            # the rows of those ids and any past them, else those past the last seen id
            top = max(others) if others else self._last_id
            new = _rdb_trials(self._rdb, sid, self._finished, set(others or ()), top)
        else:
            new = storage.get_all_trials(sid, deepcopy=False, states=self._finished)
        new = [t for t in new if t._trial_id not in self._written and (others or t._trial_id > self._last_id)]
        if new:
            self.local.add_trials(new)
        for t in new:
            self._written.add(t._trial_id)
        self._last_id = max([self._last_id, *(t._trial_id for t in new)])

    def after_trial(self, study, trial) -> None:
        """Optuna callback: queue the finished trial; write the queue when FLUSH_S has passed."""
        if self.remote is None or trial.state not in self._finished:
            return
        self._pending.append(trial)
        if time.perf_counter() - self._last_flush >= self._flush_s:
            self.flush()

    def flush(self) -> None:
        """Write the queued trials and mirror the others' new ones."""
        self._last_flush = time.perf_counter()
        if self.remote is None:
            return
        batch, self._pending = self._pending, []
        if batch and self._rdb is not None:
            ids, others = _insert_trials(self._rdb, self.remote._study_id, batch, self._last_id)
            self._written.update(ids)
            self._pull(others)
            self._last_id = max([self._last_id, *ids, *others])
            return
        for t in batch:
            self._written.add(self.remote._storage.create_new_trial(self.remote._study_id, template_trial=t))
        self._pull()

    def complete_trials(self) -> list:
        """Every completed trial of the study (all processes), numbered as stored."""
        import optuna  # deferred: Optuna takes about half a second to import

        study = self.remote if self.remote is not None else self.local
        return study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))


def ignore_sigint() -> None:
    """Pool initializer: forked workers leave Ctrl-C (sent to the whole process group) to the parent, which
    stops the pool; otherwise each worker prints its own KeyboardInterrupt traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class InterruptFlag:
    """While active (a ``with`` block in the main thread), the first Ctrl-C only sets ``hit``: the search
    stops after the trial it is running (milliseconds) and writes what it finished; a second Ctrl-C
    interrupts at once."""

    def __init__(self):
        self.hit = False
        self._old = None

    def _handler(self, signum, frame) -> None:
        self.hit = True
        signal.signal(signal.SIGINT, self._old if self._old is not None else signal.default_int_handler)

    def __enter__(self) -> InterruptFlag:
        if threading.current_thread() is threading.main_thread():
            self._old = signal.getsignal(signal.SIGINT)
            signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)
            self._old = None
