#!/usr/bin/env bash
# one-off: stop the session's engine run and start it again with patch 0007 on
pkill -f "h200_session.sh all"; pkill -f "bench.e2e_bench"; sleep 3
pkill -f "vllm"; sleep 10; pkill -9 -f "vllm|e2e_bench"; sleep 3
nvidia-smi --query-gpu=memory.used --format=csv
ps aux | grep -c "[p]ython"
rm -rf /root/results/e2e /tmp/e2e-work
setsid /root/venv-gpu/bin/python -m bench.e2e_bench --stock-site /root/stock --image-python /root/venv-gpu/bin/python \
  --models-dir /root/models --out /root/results/e2e --profile --models qwen3-coder-480b-tp8-tensor \
  --arms stock image image-vllm-topk --reps 5 --waves 6 --clients 1 8 --ready-timeout 600 \
  > /root/results/e2e-run.log 2>&1 < /dev/null &
