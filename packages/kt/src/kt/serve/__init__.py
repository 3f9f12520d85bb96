"""`kt run`: an OpenAI-compatible HTTP server for a transformers MoE model whose routed experts
run on kt (or SGLang with kt-kernel's --kt-* flags, where SGLang and a CUDA GPU are present).

    settings = ServeSettings(model="tiny").resolved()
    engine = Engine.load(settings)        # loads, patches, starts the one generation worker
    server = Server(engine, settings.host, settings.port)
    server.serve_forever()                # ... server.close()
"""

from .engine import Engine, Job
from .http import Server
from .settings import PRESET_NAME, ServeSettings

__all__ = ["PRESET_NAME", "Engine", "Job", "Server", "ServeSettings"]
