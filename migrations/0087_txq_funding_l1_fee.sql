-- Chain profiles (issue 35 §3): on an OP Stack chain a transaction also pays an L1 data
-- fee (wei, from the GasPriceOracle predeploy). A request waiting for funding records the
-- L1 fee counted when it began waiting, so the funding check asks for the same total the
-- signing path will (NULL: no L1 fee, every other chain).
ALTER TABLE txq_request ADD COLUMN funding_l1_fee_wei text;
