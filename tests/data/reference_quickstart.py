# ruff: noqa: F811, F821
# The reference SDK's quick-start code, copied verbatim from the reference documentation
# (shared/seeds/003_180db556a855b303.txt and 004_d6efaab8cfdf881c.txt): every code block that uses sie_sdk,
# and the one-line calls that continue it. tests/test_reference_quickstart.py runs each block against `sie up`
# with only the import lines changed (sie_sdk -> sie_client) and the host pointed at the stack's Envoy port.
# Not a module: the blocks are read as text, split at the "# --- block:" lines.

# --- block: 003 routing
from sie_sdk import SIEClient
from sie_sdk.types import Item
client = SIEClient("http://your-gateway:8080")
client.encode("BAAI/bge-m3", Item(text="routed by the gateway"))

# --- block: 003 batching (continues the routing block; `chunks` is the caller's list of texts)
client.encode("NovaSearch/stella_en_400M_v5", [Item(text=c) for c in chunks])

# --- block: 003 lora (continues the routing block)
client.encode("BAAI/bge-m3", Item(text="indemnification"), options={"lora": "legal"})

# --- block: 004 timing
from sie_sdk import SIEClient
from sie_sdk.types import Item
client = SIEClient("http://localhost:8080")
result = client.encode("BAAI/bge-m3", Item(text="Hello"))
print(result["timing"])
# {"queue_ms": 2.1, "inference_ms": 15.3, "total_ms": 18.5}
