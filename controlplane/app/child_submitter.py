"""The ``SubmitOperation`` action's handler: a parent machine (a drain) starts a child.

:class:`ChildSubmitter` submits the child through ``operations.submit_operation``
(validated against the cluster, admitted or queued under the worker's admission limits)
under the machine id the parent derived. Idempotent: a child that already exists is
done, so an action re-performed after a crash never makes two. A refused submission (pod
gone, workload busy) is terminal and comes back to the parent as ``ActionFailed``; an
unverifiable one is retried.

Built by the composition root next to the cluster's handlers.
"""

from __future__ import annotations

from controlplane.app.operations import submit_operation
from controlplane.app.requester import drain_requester
from controlplane.clock import Clock
from controlplane.engine.decider import Action
from controlplane.engine.kinds import KindRegistry
from controlplane.errors import UsageError
from controlplane.machines.submission import Limits
from controlplane.store import queries
from controlplane.store.database import Database
from controlplane.store.errors import DatabaseUnavailable, MachineExists, MachineNotFound
from controlplane.worker.errors import RetryableActionError, TerminalActionError
from controlplane.worker.ports import Observer


class ChildSubmitter:
    """The ``SubmitOperation`` handler."""

    def __init__(self, db: Database, kinds: KindRegistry, observer: Observer, clock: Clock,
                 limits: Limits | None) -> None:
        self.db, self.kinds, self.observer, self.clock = db, kinds, observer, clock
        self.limits = limits

    async def __call__(self, action: Action, /) -> None:
        params = action.params
        machine_id, kind, spec = params.get("machine_id"), params.get("kind"), params.get("spec")
        if not isinstance(machine_id, str) or not isinstance(kind, str) or not isinstance(
                spec, dict):
            raise TerminalActionError(f"SubmitOperation {action.key}: params machine_id, kind "
                                      "(strings) and spec (object) are required")
        try:
            await queries.get_machine(self.db, machine_id)
            return  # submitted before (the action is being re-performed): done
        except MachineNotFound:
            pass
        except DatabaseUnavailable as exc:
            raise RetryableActionError(str(exc)) from exc
        try:
            parent = action.key.partition(":submit:")[0]  # the drain's submit_key
            await submit_operation(self.db, self.kinds, self.observer, kind=kind, spec=spec,
                                   machine_id=machine_id, now=self.clock.now(),
                                   limits=self.limits, requester=drain_requester(parent))
        except MachineExists:
            return
        except UsageError as exc:
            error = TerminalActionError(str(exc))
            error.error_class = "Refused"
            raise error from exc
        except DatabaseUnavailable as exc:
            raise RetryableActionError(str(exc)) from exc
        except Exception as exc:  # unverifiable: the cluster did not answer
            raise RetryableActionError(str(exc)) from exc
