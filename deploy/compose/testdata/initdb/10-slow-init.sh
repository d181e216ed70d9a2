#!/bin/sh
# Test-only (testdata/slow-init.yaml): hold the temporary init server,
# which serves the Unix socket only, for 6 s, as a slow first start does.
echo "slow-init: sleeping 6 s with only the Unix socket served"
sleep 6
