"""gpuheal's typed wire, imported by every process and by no implementation: activity names with
their request and result models, workflow types, ids and task queues, the lease and admission
messages, each workflow's input, status and result, search attributes, and a report's bounds.

The agent and the CLI start, signal and query workflows by these names and import no workflow
class. `import api as c` reads every name; a module imports from the concern's own file."""

from api.admission import *  # noqa: F403
from api.cluster import *  # noqa: F403
from api.common import *  # noqa: F403
from api.episode import *  # noqa: F403
from api.guard import *  # noqa: F403
from api.ledger import *  # noqa: F403
from api.names import *  # noqa: F403
from api.node import *  # noqa: F403
from api.policy import *  # noqa: F403
from api.reports import *  # noqa: F403
