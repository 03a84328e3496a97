"""The llmfleet sandbox: a real Kubernetes control plane and fake GPU nodes on one CPU machine.

Not part of the operator image. The product (`llmfleet`) never imports it; the sandbox adapts
to the product's manifests at its own runtime boundary (images -> local programs with their
filesystem, volumes, and the engine stand-in inside a real Triton).
"""
