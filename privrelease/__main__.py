"""``python -m privrelease`` runs the command line."""

from privrelease.cli import main

main()
