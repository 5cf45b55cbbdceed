"""The contract's hand-written half: tensor packing beside the generated sie.v1 stubs."""
