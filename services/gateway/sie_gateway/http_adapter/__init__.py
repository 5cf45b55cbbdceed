"""The HTTP adapter: other clients' protocols (the reference SDK's msgpack wire, Cohere/Jina rerank, TEI, OpenAI's
model list) translated to the contract and called on the gateway (docs/http.md, "Other clients' protocols")."""
