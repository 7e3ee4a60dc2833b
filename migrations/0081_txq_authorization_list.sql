-- Issue 33 §5: a request may carry an EIP-7702 authorization list (an ERC-4337 bundle
-- whose operations come from EIP-7702 accounts). NULL: an EIP-1559 transaction; else a
-- JSON array of signed authorizations (alloy's JSON-RPC form: chainId, address, nonce,
-- yParity, r, s) sent as a type-4 transaction (EIP-7702 SetCode). Idempotent (the
-- upgrade tests apply it ahead of the schema they start from).
ALTER TABLE txq_request ADD COLUMN IF NOT EXISTS authorization_list jsonb;
