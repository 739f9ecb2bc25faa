"""``python -m portbench.validation plan freeze|check|show``: the pre-registration's command (:func:`.plan.main`)."""

from __future__ import annotations

import sys

from .plan import main

if __name__ == "__main__":
    args = sys.argv[1:]
    if not args or args[0] != "plan":
        print("usage: python -m portbench.validation plan {freeze,check,show} [--why '...'] [--results DIR]",
              file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(main(args[1:]))
