"""Where rollouts come from: the colocated vLLM engine, image prompts, self-speculative rollouts, the mining sampler."""
