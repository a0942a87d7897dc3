"""The platform's Pulumi CrossGuard policy pack.

Validators enforce the invariants every stack must keep (GPU taints and tolerations, pinned
images, encrypted and private model caches, IMDSv2, scoped IRSA, safe rollouts); each is a
plain function unit-tested on passing and failing resources.
"""
