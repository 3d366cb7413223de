"""multitask_classifier.py's runs one after another in one torchrun job, for the data-parallel
tests: each process joins the group once (runtime.make_runtime keeps it for the next run), so
the suite starts torchrun and its processes once for many runs. Before each run the main
process prints '=== run N'.

    torchrun --nproc_per_node 2 tests/torchrun_runs.py '[["--preset", "thesis", ...], ...]'
"""

import json
import os
import sys

from commands import command
from commands.cli import run_cli

if __name__ == "__main__":
    for i, argv in enumerate(json.loads(sys.argv[1])):
        if os.environ.get("RANK", "0") == "0":  # the others print nothing (make_runtime)
            print(f"=== run {i}", flush=True)
        run_cli(command.main, argv)
