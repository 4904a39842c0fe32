"""Model arithmetic: FLOPs, bytes, parameters and saved activations of each op of a
block, MoE routing and traffic, and the published closed forms they reproduce."""
