"""What several sub-commands of the `clfjudge` CLI share (each sub-command: clfjudge/cli/<name>.py)."""


TRUST_PICKLE_HELP = ("load a judge whose head an older clfjudge saved as a pickle (head.joblib): unpickling runs "
                     "whatever code the file holds, so only for directories you trust; re-save to drop the pickle")


def add_trust_pickle(parser) -> None:
    parser.add_argument("--trust-pickle", action="store_true", help=TRUST_PICKLE_HELP)
