//! `sol!` bindings generated from `abi/out/<Name>.json` (ABI + creation bytecode).
//!
//! Each contract module offers `deploy(provider, args…)` (creation bytecode from the
//! artifact), `new(address, provider)` for an instance, typed calls, events and custom
//! errors. Revert data decodes through the module's `…Errors` enum.
#![allow(missing_docs, clippy::too_many_arguments)]

use alloy::sol;

sol!(
    #[sol(rpc)]
    #[derive(Debug, PartialEq, Eq)]
    AssetToken,
    "../../abi/out/AssetToken.json"
);
sol!(
    #[sol(rpc)]
    #[derive(Debug, PartialEq, Eq)]
    AssetFactory,
    "../../abi/out/AssetFactory.json"
);
sol!(
    #[sol(rpc)]
    #[derive(Debug, PartialEq, Eq)]
    PriceFeed,
    "../../abi/out/PriceFeed.json"
);
sol!(
    #[sol(rpc)]
    #[derive(Debug, PartialEq, Eq)]
    PriceFeedFactory,
    "../../abi/out/PriceFeedFactory.json"
);
sol!(
    #[sol(rpc)]
    #[derive(Debug, PartialEq, Eq)]
    PriceResolver,
    "../../abi/out/PriceResolver.json"
);
sol!(
    #[sol(rpc)]
    #[derive(Debug, PartialEq, Eq)]
    Directory,
    "../../abi/out/Directory.json"
);
sol!(
    #[sol(rpc)]
    #[derive(Debug, PartialEq, Eq)]
    EntryPointReference,
    "../../abi/out/EntryPointReference.json"
);
sol!(
    #[sol(rpc)]
    #[derive(Debug, PartialEq, Eq)]
    BatchPay,
    "../../abi/out/BatchPay.json"
);
sol!(
    #[sol(rpc)]
    #[derive(Debug, PartialEq, Eq)]
    BlockingToken,
    "../../abi/out/BlockingToken.json"
);
sol!(
    #[sol(rpc)]
    #[derive(Debug, PartialEq, Eq)]
    SponsorPaymaster,
    "../../abi/out/SponsorPaymaster.json"
);
sol!(
    #[sol(rpc)]
    #[derive(Debug, PartialEq, Eq)]
    SystemFactory,
    "../../abi/out/SystemFactory.json"
);
sol!(
    #[sol(rpc)]
    #[derive(Debug, PartialEq, Eq)]
    OrgAssetFactory,
    "../../abi/out/OrgAssetFactory.json"
);
sol!(
    #[sol(rpc)]
    #[derive(Debug, PartialEq, Eq)]
    RegulatedToken,
    "../../abi/out/RegulatedToken.json"
);
sol!(
    #[sol(rpc)]
    #[derive(Debug, PartialEq, Eq)]
    IdentityRegistry,
    "../../abi/out/IdentityRegistry.json"
);
sol!(
    #[sol(rpc)]
    #[derive(Debug, PartialEq, Eq)]
    Compliance,
    "../../abi/out/Compliance.json"
);
