"""One module per task: what varies between classification, detection and embeddings lives here.

Each module declares one :class:`~service.tasks.base.Task` and registers it; importing this
package registers the built-in ones. Adding a task is one new module and one import below
(docs/STYLE.md, "How to add a task").
"""

from service.tasks import classification, detection, embedding  # noqa: F401  (registers them, in this order)
from service.tasks.base import (
    BaseTask,
    Task,
    all_tasks,
    get,
    names,
    options,
    output,
    register,
    role_outputs,
    served_tasks,
    serves,
    unregister,
    verbs,
)

__all__ = [
    "BaseTask",
    "Task",
    "all_tasks",
    "get",
    "names",
    "options",
    "output",
    "register",
    "role_outputs",
    "served_tasks",
    "serves",
    "unregister",
    "verbs",
]
