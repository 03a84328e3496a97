"""How Kubernetes names GPUs: GPU Feature Discovery's node labels and the NVIDIA device
plugin's resource, and the labels managed clusters put on a node to name its node pool. The
planner counts nodes by them, render places pods by them, and the sandbox puts them on its fake
nodes."""

GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRESENT_LABEL = "nvidia.com/gpu.present"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"  # the catalog's gfd_product of the GPU type
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"  # MiB per GPU
GPU_COUNT_LABEL = "nvidia.com/gpu.count"

# The node's pool, first label found wins. Kubernetes has no pool of its own; these are what the
# node provisioners write on every node they make:
# - Karpenter: `karpenter.sh/nodepool`, the NodePool that made the node (sigs.k8s.io/karpenter,
#   pkg/apis/v1/labels.go, NodePoolLabelKey); first, as Karpenter also runs on EKS and GKE;
# - EKS managed node groups: `eks.amazonaws.com/nodegroup` (docs.aws.amazon.com/eks/latest/
#   userguide/managed-node-groups.html);
# - GKE: `cloud.google.com/gke-nodepool` (cloud.google.com/kubernetes-engine/docs/how-to/node-pools);
# - AKS: `kubernetes.azure.com/agentpool` (learn.microsoft.com/azure/aks/use-labels, the labels
#   AKS reserves).
# A node with none of them (bare metal, kubeadm, the sandbox) is in its GPU product's pool.
NODE_POOL_LABELS = ("karpenter.sh/nodepool", "eks.amazonaws.com/nodegroup", "cloud.google.com/gke-nodepool",
                    "kubernetes.azure.com/agentpool")
