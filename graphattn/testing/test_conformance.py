"""The conformance suite's test: every selected backend x batch spec x mode.

Run it with ``pytest --pyargs graphattn.testing --attn-backend NAME`` (or ``graphattn check
--attn-backend NAME``); the plugin (``graphattn.testing.plugin``) parametrizes ``graphattn_case``.
"""


def test_conformance(graphattn_case):
    graphattn_case.run()
