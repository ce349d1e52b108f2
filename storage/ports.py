"""What the core stores, as interfaces: the one storage seam.

The gateway, the runtime and the providers talk to these Protocols only; an engine implements
them all (SQLite, the embedded default: :mod:`pluto.storage.sqlite`). Each method is one atomic
change or one consistent read: a multi-statement change is never left half-made, and never
commits or rolls back anyone else's work. A component gets the part it needs (the outbox gets
``store.outbox``), never a connection.
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Callable, Collection, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from pluto.events import RunEvent
from pluto.storage.rows import (Approval, ToolApproval, MessageRow, OutboxRow, PairingRequest, RunRow,
                                SessionRow, StepRow, TaskRow)

if TYPE_CHECKING:  # the ledger's rows, shared by both engines (SqlUsage runs on each)
    from pluto.storage.sql import Statement
    from pluto.storage.sql.usage import Claim as BudgetClaim
    from pluto.storage.sql.usage import Reservation, UsageCall, UsageTotal
    from pluto.storage.sql.schedules import Firing, Schedule

# Several instances: the chat claim a message was taken under, (lease name, token); every
# write of the run answering it is refused once the claim moved on (storage/sql/fencing.py).
Claim = tuple[str, int]


class RunReader(Protocol):
    """A run and its events: what watchers read (the run feed, the API's views)."""

    async def run(self, run_id: str) -> RunRow | None: ...

    async def events(self, run_id: str, after: int = 0) -> list[RunEvent]:
        """The run's committed events with ``seq`` greater than ``after``, in order. When
        none is and the run has ended, its ``run.end`` all the same (a watcher at or past the
        end learns that the run ended)."""
        ...


class ConversationStore(RunReader, Protocol):
    """Sessions, their messages, runs and run events."""

    # the instance whose runs these are (the gateway sets it; "local" with one process)
    owner: str
    # several instances: the channel (as the database names it) on which every write of run
    # events notifies ``owner|run_id`` when it commits, in the same statement (None: no one
    # listens); the run feeds of the other instances hear it (gateway/feed.py) — only for
    # runs one of them follows (follow_elsewhere)
    notify_channel: str | None

    async def follow_elsewhere(self, run_id: str, following: bool = True) -> None:
        """(Several instances) This instance follows ``run_id`` (executing on any instance):
        its writes notify from now on; ``following`` False: no longer."""
        ...

    async def session(self, key: str, agent: str) -> SessionRow:
        """The active session for ``key``, created when there is none."""
        ...

    async def newest_tool_result(self, session_id: str, name: str) -> str | None:
        """What the session's newest call of tool ``name`` returned (None: never called)."""
        ...

    async def reset_session(self, key: str) -> bool:
        """Close the active session of ``key`` (kept, no longer used); False if none."""
        ...

    async def add_message(self, session_id: str, role: str, content: str | None, *,
                          run_id: str | None = None,
                          tool_calls: list[dict[str, Any]] | None = None,
                          tool_call_id: str | None = None, name: str | None = None,
                          event: RunEvent | None = None) -> RunEvent | None:
        """Append a message and, atomically with it, the run event that shows it (returned with
        its ``seq``)."""
        ...

    async def messages(self, session_id: str, limit: int = 1000) -> list[MessageRow]: ...

    async def run_sources(self, session_id: str, limit: int) -> dict[str, str]:
        """The message each of the session's latest runs answers: run id -> message id."""
        ...

    async def deletions(self, session_id: str) -> int:
        """How many times messages of the session were deleted (several instances: a run
        taken over, its message put back to be answered again): a reader of several
        statements that must agree reads it before and after them."""
        ...

    async def find_sessions(self, query: str = "", *,
                            limit: int = 50) -> builtins.list[dict[str, Any]]:
        """Sessions, newest first, whose key or text holds ``query`` (the admin console)."""
        ...

    async def history(self, session_id: str, max_messages: int,
                      max_tokens: int) -> list[dict[str, Any]]:
        """The newest messages that fit the window, as model messages, always well-formed."""
        ...

    def claim(self, source: tuple[str, str], claim: Claim | None) -> None:
        """Several instances: the message ``source`` (provider, message id) was taken under the
        chat claim ``claim`` (lease name, token): every write of the run answering it is
        refused once that claim moved on (None: done with it)."""
        ...

    async def session_running(self, key: str) -> bool:
        """Whether the session ``key`` has a run going or waiting (on any instance)."""
        ...

    async def queue_run(self, run_id: str, session_id: str, agent: str, input_text: str, *,
                        source: tuple[str, str] | None = None) -> None:
        """Record a run accepted for a session: ``queued`` until it starts (recorded before:
        unchanged). ``source`` (provider, message id): the inbox's message it answers, marked
        handled in the same commit."""
        ...

    async def start_run(self, run_id: str, session_id: str, agent: str, input_text: str,
                        event: RunEvent, *, source: tuple[str, str] | None = None,
                        message: bool = True) -> RunEvent:
        """Mark the run running (recording it if it was not queued), with the user's message
        (unless ``message`` is false: a run resuming an approval says nothing new) and its
        ``run.start``, in one commit; ``source``: the inbox's message it answers, marked
        handled in that commit too."""
        ...

    async def cancel_run(self, run_id: str, session_id: str, agent: str, input_text: str,
                         event: RunEvent, *, error: str,
                         source: tuple[str, str] | None = None) -> RunEvent | None:
        """A run stopped before it could start (or before it was recorded at all): record it
        cancelled with its ``run.end``, unless it has ended already (None then)."""
        ...

    async def append_event(self, event: RunEvent, *, durable: bool = True) -> RunEvent:
        """Commit one event of a running run; returns it with its ``seq``. ``durable=False``
        (a streamed preview batch): numbered at once and committed behind the caller, at the
        latest in the commit of the run's next durable write (which takes it along first), so
        a crash loses at most the previews not yet committed, never an answer."""
        ...

    async def end_run(self, run_id: str, status: str, *, error: str | None = None,
                      usage: dict[str, int] | None = None,
                      event: RunEvent | None = None) -> RunEvent | None:
        """Close a run (and record its ``run.end``) in one commit."""
        ...

    async def complete_run(self, run_id: str, session_id: str, final: RunEvent, end: RunEvent,
                           *, usage: dict[str, int]) -> tuple[RunEvent, RunEvent]:
        """A run's answer (the assistant's message with its ``message.final``) and its
        ``run.end``, in one commit; returns both with their ``seq``."""
        ...

    async def unfinished_runs(self, started_before: float) -> list[str]:
        """Ids of runs queued or running that started before ``started_before``."""
        ...

    async def undelivered_answer(self, run_id: str) -> RunEvent | None:
        """The run's ``message.final`` when it ended answered and none of its reply is in the
        outbox (storage failed between the two)."""
        ...

    async def undelivered_in_chat(self, provider: str, chat_id: str | None
                                  ) -> list[tuple[dict[str, Any], RunEvent]]:
        """Runs of this chat (None: of every chat of the provider) answered by another instance
        (or the last process) whose reply never reached the outbox: (the message, the answer),
        oldest first, for this instance to deliver."""
        ...

    async def recover_runs(self, run_ids: list[str]) -> list[RunEvent]:
        """One process per database: these runs (no task of this process runs them) are
        ended interrupted and their messages go back to the inbox."""
        ...

    async def recover_interrupted(self, *, requeue: bool = True) -> list[RunEvent]:
        """Runs a dead process left queued or running (one process per database): marked
        interrupted, each with a ``run.end`` (returned, so that watchers can be told); with
        ``requeue`` their messages go back to the inbox to be answered again."""
        ...

    async def take_over_chat(self, provider: str, chat_id: str) -> list[RunEvent]:
        """Several instances: runs of this chat that another instance left unfinished are
        ended (interrupted) and their messages go back to the inbox, ahead of later ones."""
        ...

    async def orphaned_chats(self, alive: set[str] | None, *,
                             answered_in_feed: tuple[str, ...] = (),
                             waiting_longer_than: float | None = None) -> list[tuple[str, str]]:
        """(provider, chat) of unfinished runs whose instance is not among ``alive`` (or
        answered with no reply in the outbox, but for the providers ``answered_in_feed``);
        ``alive`` None: the instances whose heartbeat lease is current, in the same query;
        ``waiting_longer_than``: with the chats holding a message not handled received longer
        ago than so many seconds, in the same query too."""
        ...

    async def recent_runs(self, *, limit: int = 50, agent: str | None = None,
                          status: str | None = None) -> list[dict[str, Any]]: ...

    async def stats(self) -> dict[str, int]: ...


class OutboxStore(Protocol):
    """Every chunk of every reply, recorded before it is sent (see gateway/delivery/outbox.py)."""

    async def record(self, rows: list[OutboxRow]) -> list[OutboxRow]:
        """Record a reply's chunks (those recorded before stay as they are); return every chunk
        of that reply, in order, as stored."""
        ...

    async def reply(self, reply_id: str) -> list[OutboxRow]: ...

    async def pending(self, provider: str) -> list[OutboxRow]:
        """Unsent chunks for a provider, oldest reply first, each reply's chunks in order."""
        ...

    async def pending_all(self) -> list[OutboxRow]:
        """:meth:`pending` of every provider, in one query."""
        ...

    async def record_claimed(self, rows: list[OutboxRow], owner: str, lease_seconds: float,
                             *, count: bool = True) -> tuple[list[OutboxRow], bool]:
        """:meth:`record`, and in the same commit claim the reply for ``owner`` and (``count``)
        count a first attempt of its first pending chunk (the sender calls the platform with
        it next; each later chunk is counted when the one before it is marked sent);
        False when another owner holds it."""
        ...

    async def claim(self, reply_id: str, owner: str, lease_seconds: float) -> bool:
        """Take a reply for sending; False while another owner's lease on it holds."""
        ...

    async def release(self, reply_id: str, owner: str) -> None: ...

    @property
    def shared(self) -> bool:
        """Several instances send from it (a claim then lasts as long as its owner lives)."""
        ...

    async def attempted(self, row_id: int) -> None:
        """Counted before each platform call (a later failure sets ``error``)."""
        ...

    async def sent(self, row_id: int, platform_id: str | None, *,
                   release: tuple[str, str] | None = None, count: int | None = None) -> None:
        """Mark a chunk sent; ``release`` (reply id, owner): give up the claim in the same
        commit (after the reply's last chunk); ``count``: the id of the chunk sent next, whose
        call is counted in that commit."""
        ...

    async def failed(self, row_ids: list[int], error: str) -> None: ...

    async def note_error(self, row_id: int, error: str, *, unsent: bool = False) -> None: ...

    async def prune(self, older_than_seconds: float) -> int: ...


class LeaseStore(Protocol):
    """Leases with fencing tokens (see :mod:`pluto.storage.sql.leases`): which instance
    holds a chat's intake, a session's runs, or a single-owner connection."""

    # several instances: the channel told when a lease is let go (None: nobody to tell)
    notify: str | None

    async def acquire(self, name: str, owner: str, ttl: float, *,
                      takeover: bool = True) -> int | None:
        """The lease's token if ``owner`` holds it now; None when another does (or held it
        when it ran out, unless ``takeover``). Tokens only grow."""
        ...

    async def take(self, name: str, owner: str, ttl: float, *,
                   takeover: bool = True) -> tuple[int, bool] | None:
        """:meth:`acquire`, and whether it was taken from another owner: (token, taken)."""
        ...

    async def take_reading(self, name: str, owner: str, ttl: float, read: Statement, *,
                           takeover: bool = True) -> tuple[tuple[int, bool] | None, list[Any]]:
        """:meth:`take`, and the rows of the SELECT ``read`` once it is taken (one statement
        where the engine can): (None, []) when another holds it."""
        ...

    async def take_along(self, name: str, owner: str, ttl: float,
                         parts: list[tuple[str, Statement]], result: str, read: Statement, *,
                         only_if: str, takeover: bool = True,
                         after: Sequence[tuple[str, Statement]] = ()
                         ) -> tuple[Any, tuple[int, bool] | None, list[Any]] | None:
        """:meth:`take_reading` in one statement with other changes, taken only if the part
        ``only_if`` returned a row (PostgreSQL; None elsewhere): (the value of ``result``,
        the take, the rows read); ``after``: changes made after the take, which may read
        ``l`` (one row when it was taken)."""
        ...

    async def renew(self, name: str, owner: str, token: int, ttl: float) -> bool: ...

    async def renew_all(self, owner: str, tokens: dict[str, int], ttl: float) -> set[str]:
        """Renew many at once; the names that were lost."""
        ...

    async def release(self, name: str, owner: str, token: int) -> bool: ...

    async def holder(self, name: str) -> Any | None: ...

    async def held(self, prefix: str = "") -> list[Any]: ...


class FloodStore(Protocol):
    """Flood control: per destination (provider, chat), the time (seconds since the epoch)
    before which nothing may be sent to it — a platform's retry-after, kept across restarts
    (see gateway/delivery/flood.py)."""

    # several instances (PostgreSQL): the channel each new hold is told on (None: not told)
    notify: str | None

    async def hold(self, provider: str, chat_id: str, until: float) -> None:
        """Keep ``until`` for the chat, unless a later deadline is kept already."""
        ...

    async def holds(self, now: float) -> list[tuple[str, str, float]]:
        """(provider, chat id, until) of every hold still in force at ``now``."""
        ...

    async def current(self, now: float) -> list[tuple[str, str, float]]:
        """:meth:`prune`, then :meth:`holds` (one statement where the database can)."""
        ...

    async def prune(self, now: float) -> int:
        """Forget the holds that ended before ``now``."""
        ...


class InboundStore(Protocol):
    """The inbox: messages handed over by providers, keyed by the platform's message id, so a
    redelivery is recognised (dedupe) and a message not yet handled survives a restart."""

    # several instances: the channel told of each message recorded, in the statement that
    # records it (None: nobody to tell)
    notify: str | None

    def claim(self, source: tuple[str, str], claim: Claim | None) -> None:
        """The message ``source`` (provider, message id) was taken under the chat claim
        ``claim``: its outcome is recorded only while the claim holds (None: done with it)."""
        ...

    async def accept(self, provider: str, message_id: str, payload: dict[str, Any]) -> bool:
        """Record a message as received and not yet handled; False when it was recorded
        before (a redelivery)."""
        ...

    async def handled(self, provider: str, message_id: str,
                      outcome: dict[str, Any] | None = None) -> None:
        """The pipeline decided what becomes of it (messages that start a run are marked by
        :meth:`ConversationStore.queue_run`, in the same commit); ``outcome``: what, for
        :meth:`outcome` (a refusal, a command's answer…)."""
        ...

    async def outcome(self, provider: str, message_id: str) -> dict[str, Any] | None:
        """What became of a message once it is handled (by any instance); None until then."""
        ...

    async def unhandled_in_chat(self, provider: str, chat_id: str,
                                limit: int = 100) -> list[dict[str, Any]]:
        """The chat's messages not yet handled, in arrival order (whoever received them)."""
        ...

    async def waiting_in_chat(self, provider: str, chat_id: str, session_id: str | None,
                              limit: int = 100) -> list[dict[str, Any]]:
        """The chat's messages waiting for their turn, in arrival order: not yet handled, or
        taken up by a run of session ``session_id`` still queued (in no transcript yet)."""
        ...

    async def take_chat(self, leases: LeaseStore, name: str, owner: str, ttl: float,
                        provider: str, chat_id: str, *, takeover: bool = True
                        ) -> tuple[tuple[int, bool] | None, list[dict[str, Any]]]:
        """The chat's lease taken, and once it is, :meth:`unhandled_in_chat` (one statement
        where the engine can): (None, []) when another instance holds the chat."""
        ...

    async def accept_taking(self, leases: LeaseStore, name: str, owner: str, ttl: float,
                            provider: str, message_id: str, payload: dict[str, Any], *,
                            takeover: bool = True
                            ) -> tuple[bool, tuple[int, bool] | None,
                                       list[dict[str, Any]]] | None:
        """:meth:`accept` and, if it is new, :meth:`take_chat` of its chat in one statement,
        where the engine can (else None: the caller makes them apart): (whether it is new,
        the take, the chat's messages waiting before it — the message itself not among
        them)."""
        ...

    async def keep_preview(self, provider: str, message_id: str, platform_id: str) -> None:
        """The live preview shown in answer to the message (a rerun after a crash edits it)."""
        ...

    async def waiting_chats(self, provider: str, older_than: float) -> list[str]:
        """Chats with a message that has waited longer than ``older_than`` seconds."""
        ...

    async def unhandled(self, provider: str, *, older_than: float = 0.0
                        ) -> list[dict[str, Any]]:
        """Payloads of messages received and never handled (the process died, or storage
        failed while they were handled), oldest first; ``older_than``: received at least that
        many seconds ago."""
        ...

    async def prune(self) -> int: ...

    async def count(self) -> int: ...


class TaskStore(Protocol):
    """The HTTP API's tasks and steps (Agent Protocol)."""

    async def create_task(self, agent: str | None, text: str, additional_input: dict[str, Any],
                          requested_agent: str | None = None,
                          owner: str | None = None) -> TaskRow: ...

    async def task(self, task_id: str) -> TaskRow | None: ...

    async def tasks(self, offset: int, limit: int,
                    owner: str | None = None) -> tuple[list[TaskRow], int]:
        """A page of tasks, newest first: those of ``owner``, or every task when None."""
        ...

    async def task_of_run(self, run_id: str) -> TaskRow | None:
        """The task whose step points at this run (None: not a run of the API)."""
        ...

    async def add_step(self, task_id: str, text: str,
                       additional_input: dict[str, Any]) -> StepRow: ...

    async def step(self, task_id: str, step_id: str) -> StepRow | None: ...

    async def last_step(self, task_id: str) -> StepRow | None: ...

    async def steps(self, task_id: str, offset: int, limit: int) -> tuple[list[StepRow], int]: ...

    async def started(self, step_id: str, run_id: str) -> None: ...

    async def has_run(self, run_id: str) -> bool:
        """Whether a step points at this run (it may not have started yet)."""
        ...

    async def answered(self, step_id: str, *, output: str | None = None,
                       error: str | None = None) -> None: ...


class PairingStore(Protocol):
    """DM pairing: codes given to unknown users, approvals by an admin."""

    async def is_approved(self, provider: str, user_id: str) -> bool: ...

    async def request(self, provider: str, user_id: str, chat_id: str, user_name: str | None,
                      ttl: float) -> PairingRequest:
        """The user's valid code, or a new one."""
        ...

    async def approve(self, code: str, *, by: str) -> Approval: ...

    async def revoke(self, provider: str, user_id: str) -> bool: ...

    async def pending(self) -> list[PairingRequest]: ...

    async def approved(self) -> list[Approval]: ...


class RateBucketStore(Protocol):
    """Rate-limit token buckets shared by the instances (see ``storage/sql/ratelimits``)."""

    async def take(self, buckets: list[tuple[str, int, float]]) -> tuple[int, float, bool] | None:
        """Take one message from each (key, count, seconds) bucket, or from none: None, or
        (index of the empty one, seconds until it refills, first refusal of its streak)."""
        ...


class UsageStore(Protocol):
    """The usage ledger: one row per model call, and budget resets (``storage/sql/usage``)."""

    async def record(self, call: UsageCall, periods: Mapping[str, float] | None = None,
                     release: Reservation | None = None) -> None:
        """Add a call to the ledger and to its budgets' counters of ``periods``, giving back
        ``release`` (the call's reservation) in the same transaction."""
        ...

    def record_soon(self, call: UsageCall, periods: Mapping[str, float] | None = None,
                    release: Reservation | None = None) -> asyncio.Future[int]:
        """:meth:`record` without waiting: it rides with the next commit; the future settles
        once it is committed."""
        ...

    async def reserve(self, claims: tuple[BudgetClaim, ...], tokens: int, cost: float,
                      prompt: int) -> int | None:
        """Take ``tokens`` and ``cost`` from every claim's counter, or from none: the index of
        the first claim whose budget has no room, else None."""
        ...

    async def release(self, reservation: Reservation) -> None:
        """Give a reservation back without recording a call (its call was never made)."""
        ...

    async def calls(self, *, run_id: str | None = None, since: float | None = None,
                    limit: int = 1000) -> list[UsageCall]: ...

    async def totals(self, by: str, *, since: float | None = None, until: float | None = None,
                     limit: int = 500) -> list[UsageTotal]: ...

    async def spent(self, scope: str, key: str, period: str, start: float) -> UsageTotal:
        """What ``key`` spent in the period that began at ``start`` (since its last reset)."""
        ...

    async def counters(self, scope: str, period: str, start: float,
                       limit: int = 200) -> list[UsageTotal]: ...

    async def reset(self, scope: str, key: str) -> None: ...

    async def resets(self) -> dict[tuple[str, str], float]: ...


class HistoryStore(Protocol):
    """A conversation's compactions and full-text search (see ``storage/sql/memory``)."""

    async def since_summary(self, session_id: str) -> tuple[Any, list[tuple[int, MessageRow]]]:
        """The latest compaction (or None) and the messages after it, oldest first."""
        ...

    async def compacted(self, c: Any) -> None: ...

    async def compactions(self, session_id: str) -> list[Any]: ...

    async def search(self, session_key: str, query: str, limit: int = 10) -> list[Any]:
        """Messages of every session of ``session_key`` holding the query's words, newest
        first."""
        ...


class NotesStore(Protocol):
    """Long-term memory files in a shared database (see ``storage/sql/memory``)."""

    async def read(self, owner: str) -> tuple[str, int] | None: ...

    async def write(self, owner: str, expected_rev: int, revision: dict[str, Any]) -> bool:
        """Compare-and-set on the revision number; False when another write came first."""
        ...

    async def revisions(self, owner: str) -> list[dict[str, Any]]: ...

    async def owners(self) -> list[str]: ...


class IdempotencyStore(Protocol):
    """``Idempotency-Key`` records of the HTTP API, per caller, kept 24 h (in the database, so
    every instance sees them); see :mod:`pluto.storage.sql.idempotency`."""

    async def begin(self, scope: str, key: str, fingerprint: str, token: str, *,
                    lock: float) -> Any | None:
        """Claim the key for the attempt ``token`` (None), or the key's record as it is."""
        ...

    async def made(self, scope: str, key: str, token: str, resource: str) -> None: ...

    async def answered(self, scope: str, key: str, token: str, status: int,
                       response: str) -> bool: ...

    async def adopt(self, scope: str, key: str, token: str, *, lock: float) -> bool:
        """Take over a key whose attempt died after making its resource."""
        ...

    async def release(self, scope: str, key: str, token: str) -> None: ...

    async def prune(self) -> int: ...


class BlobStore(Protocol):
    """Files every instance can read (charts, results, files users sent, datasets), keyed by
    their path under the data dir (:func:`pluto.storage.blobs.check_key`). SQLite (one
    instance): nothing is kept, the data dir is the only copy (``shared`` False). PostgreSQL:
    a table, within size caps (:mod:`pluto.storage.postgres.blobs`)."""

    shared: bool

    async def migrate(self) -> None: ...

    async def put(self, key: str, path: Any, *, meta: str = "", max_bytes: int,
                  max_total: int) -> str:
        """Keep the file at ``path`` as ``key`` (replacing it); its SHA-256 (``""`` when
        nothing is kept). ``BlobTooLarge`` past either cap, ``BlobNameRefused`` for a bad key."""
        ...

    async def fetch(self, key: str, dest: Any) -> bool:
        """Write the blob to ``dest`` (whole or not at all); False when there is none."""
        ...

    async def delete(self, key: str) -> bool: ...

    async def listing(self, prefix: str) -> list[tuple[str, int, str, str]]:
        """(key, size, sha256, meta) of the blobs whose key starts with ``prefix``."""
        ...

    async def prune(self, prefixes: tuple[str, ...], older_than: float, max_total: int) -> int:
        ...


class Bus(Protocol):
    """Notifications between instances sharing the database (PostgreSQL's LISTEN/NOTIFY)."""

    async def scoped(self, channel: str) -> str:
        """The name ``channel`` has in the database (scoped to the store's schema), for a
        statement that notifies it itself (``pg_notify``)."""
        ...

    async def publish(self, channel: str, payloads: list[str]) -> None: ...

    def subscribe(self, channel: str, callback: Callable[[str | None], None]) -> None:
        """``callback(payload)`` for each notification; ``callback(None)`` after a gap."""
        ...

    @property
    def hearing(self) -> bool:
        """Whether notifications are heard now (the listening connection is up): while it is
        not, one sent is lost — a note's absence then tells nothing."""
        ...


class ApprovalStore(Protocol):
    """Tool calls waiting for a person's decision (``storage/sql/approvals``)."""

    async def create(self, *, id: str, run_id: str, session_id: str, session_key: str,
                     agent: str, provider: str, chat_id: str, thread_id: str | None,
                     asker: str, approvers: tuple[str, ...], tool: str, call_id: str,
                     arguments: str, turn: dict[str, Any], timeout: float) -> ToolApproval: ...

    async def get(self, approval_id: str) -> ToolApproval | None: ...

    async def latest_pending(self, provider: str, chat_id: str) -> ToolApproval | None: ...

    async def of_run(self, run_id: str) -> builtins.list[ToolApproval]: ...

    async def decide(self, approval_id: str, verdict: str, *, by: str, message_id: str | None,
                     reason: str | None = None) -> tuple[ToolApproval | None, bool]: ...

    async def expire_due(self, limit: int = 100) -> builtins.list[ToolApproval]: ...

    async def unresumed(self, older_than: float,
                        limit: int = 100) -> builtins.list[ToolApproval]: ...

    async def claim_resume(self, approval_id: str, run_id: str,
                           message_id: str | None) -> bool: ...

    async def approved_before(self, session_id: str, tool: str) -> bool: ...

    async def cancel_pending(self, session_key: str,
                             reason: str) -> builtins.list[ToolApproval]: ...


class ScheduleStore(Protocol):
    """Schedules and their firings (storage/sql/schedules.py: a firing is claimed by one
    statement, on the database's clock)."""

    clock: Callable[[], float] | None  # tests: now, instead of the database's clock

    async def now(self) -> float: ...

    async def add(self, schedule: Schedule) -> Schedule: ...

    async def put(self, schedule: Schedule, *, keep_due: bool = False) -> None: ...

    async def get(self, schedule_id: str) -> Schedule | None: ...

    async def list(self, *, owner: tuple[str, str] | None = None, source: str | None = None,
                   active: bool = True) -> builtins.list[Schedule]: ...

    async def count(self, owner: tuple[str, str]) -> int: ...

    async def cancel(self, schedule_id: str, *,
                     owner: tuple[str, str] | None = None) -> bool: ...

    async def remove(self, schedule_id: str) -> bool: ...

    async def due_now(self, schedule_id: str) -> bool: ...

    async def next_due(self, providers: Collection[str] | None = None) -> float | None: ...

    async def soonest(self, providers: Collection[str] | None = None
                      ) -> tuple[float, float | None]: ...

    async def due(self, limit: int = 100, *, providers: Collection[str] | None = None
                  ) -> tuple[float, builtins.list[Schedule]]: ...

    async def claim(self, schedule: Schedule, *, now: float, next_due: float | None,
                    missed: bool, instance: str | None = None) -> Firing | None: ...

    async def fired(self, firing_id: int, outcome: str | None, *, run_id: str | None = None,
                    detail: str | None = None) -> None: ...

    async def queued(self, firing_id: int) -> None: ...

    async def firing(self, firing_id: int) -> Firing | None: ...

    async def stranded(self, alive: Collection[str], older_than: float,
                       providers: Collection[str] | None = None
                       ) -> builtins.list[tuple[Firing, Schedule]]: ...

    async def adopt(self, firing: Firing, instance: str, *, now: float) -> bool: ...

    async def history(self, schedule_id: str | None = None,
                      limit: int = 50) -> builtins.list[Firing]: ...


class Store(Protocol):
    """One database: every part above, opened and closed together (``async with store``).

    The parts are read-only here (an engine's own classes implement them)."""

    @property
    def conversations(self) -> ConversationStore: ...

    @property
    def outbox(self) -> OutboxStore: ...

    @property
    def inbound(self) -> InboundStore: ...

    @property
    def tasks(self) -> TaskStore: ...

    @property
    def pairing(self) -> PairingStore: ...

    @property
    def flood(self) -> FloodStore: ...

    @property
    def leases(self) -> LeaseStore: ...

    @property
    def rates(self) -> RateBucketStore: ...

    @property
    def usage(self) -> UsageStore: ...

    @property
    def history(self) -> HistoryStore: ...

    @property
    def schedules(self) -> ScheduleStore: ...

    @property
    def approvals(self) -> ApprovalStore: ...

    @property
    def console(self) -> Any:  # storage/sql/console.SqlConsole: accounts, sessions, audit
        ...

    @property
    def notes(self) -> NotesStore: ...

    @property
    def idempotency(self) -> IdempotencyStore: ...

    @property
    def blobs(self) -> BlobStore:
        """Files every instance can read."""
        ...

    @property
    def bus(self) -> Bus | None:
        """None: one process per database, nothing to tell."""
        ...

    @property
    def shared(self) -> bool:
        """Several gateway instances use this database at once (PostgreSQL)."""
        ...

    @property
    def is_open(self) -> bool: ...

    def describe(self) -> str:
        """The engine and where, fit for a log line (no password)."""
        ...

    async def open(self) -> None:
        """Connect and bring every table to its newest schema."""
        ...

    async def close(self) -> None: ...

    async def __aenter__(self) -> Store:
        """:meth:`open`, for ``async with``."""
        ...

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None, /) -> None:
        """:meth:`close`."""
        ...
