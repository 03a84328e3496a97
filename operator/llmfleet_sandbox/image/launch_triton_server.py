"""The image's /app/scripts/launch_triton_server.py (tensorrtllm_backend's multi-GPU launcher).

The real script starts one tritonserver per rank under mpirun, rank 0 serving the ports. The
emulated engine has no ranks (one process models the whole TP group, its profile already
accounts for TP), so this stand-in parses the same flags and execs ONE tritonserver in the
foreground with rank 0's flags: the pod serves as a TP>=2 pod does, with one process.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

DEFAULT_TRITONSERVER = "/opt/tritonserver/bin/tritonserver"


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="launch_triton_server.py",
                                     description="Launch tritonserver for a TensorRT-LLM model (sandbox stand-in: "
                                                 "one server for the whole world size)")
    parser.add_argument("--world_size", type=int, default=1, help="TP x PP ranks (one emulated process serves all)")
    parser.add_argument("--tritonserver", default=DEFAULT_TRITONSERVER)
    parser.add_argument("--model_repo", required=True)
    parser.add_argument("--http_port", type=int, default=8000)
    parser.add_argument("--grpc_port", type=int, default=8001)
    parser.add_argument("--metrics_port", type=int, default=8002)
    parser.add_argument("--log", action="store_true", help="verbose server log")
    parser.add_argument("--log-file", default="triton_log.txt")
    # Accepted for compatibility with the real launcher; nothing to do without MPI ranks.
    parser.add_argument("--force", action="store_true")
    parser.add_argument("--oversubscribe", action="store_true")
    parser.add_argument("--no-mpi", action="store_true")
    parser.add_argument("--multi-model", action="store_true")
    parser.add_argument("--tensorrt_llm_model_name", default="tensorrt_llm")
    parser.add_argument("--multimodal_gpu0_cuda_mem_pool_bytes", type=int, default=0)
    return parser


def server_command(args: argparse.Namespace) -> list[str]:
    """Rank 0's command line of the real launcher."""
    command = [args.tritonserver, f"--model-repository={args.model_repo}", f"--grpc-port={args.grpc_port}",
               f"--http-port={args.http_port}", f"--metrics-port={args.metrics_port}",
               "--disable-auto-complete-config", "--backend-config=python,shm-region-prefix-name=prefix0_"]
    if args.log:
        command += ["--log-verbose=3", f"--log-file={args.log_file}"]
    return command


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.world_size < 1:
        parser().error("--world_size must be at least 1")
    command = server_command(args)
    binary = command[0] if os.path.sep in command[0] else shutil.which(command[0])
    if binary is None:
        print(f"launch_triton_server.py: {command[0]} not found", file=sys.stderr)
        sys.exit(1)
    os.execv(binary, command)
