"""A tiny DeepSeek-V3 / Kimi-K2 style model as a remote-code folder (config.json's auto_map, loaded
with trust_remote_code=True): kt.testing.remote_code.write_remote_model copies these two files next
to the weights. Written for kt's tests after the structure of those models' own modeling files —
per-expert MLP modules in an nn.ModuleList, a router returning (indices, weights), the block's own
`moe_infer` loop, shared experts — not copied from them."""
