"""kt, the application on kt-core: weights and `kt convert` (kt.weights), GGUF files (kt.gguf),
the model registry (kt.models), `kt run`/`kt chat` (kt.serve), the transformers integration
(kt.integrations.transformers), `kt bench` (kt.bench) and the commands kt-core's `kt` script
dispatches to (kt.cli). Importing kt imports none of them."""

__version__ = "0.1.0"
