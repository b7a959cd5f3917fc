//! Who a 2026-07-28 request is from, as far as upstream state goes. A leaf of the face: the pool,
//! the listen hub and the wire key by it, it names none of them.

use std::net::IpAddr;

use crate::identity::Identity;

/// Who a 2026-07-28 request is from, as far as upstream state goes: its identity, or for an
/// anonymous caller its address. Anonymous callers at different addresses never share an upstream
/// session, nor each other's notifications, nor can one end the other's listens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Who {
    /// An identified caller.
    Identity(Identity),
    /// An anonymous caller, by peer address (`None`: in-process callers, tests).
    Anonymous(Option<IpAddr>),
}

impl Who {
    /// `identity`, or the anonymous caller at `peer`.
    pub fn of(identity: Option<Identity>, peer: Option<IpAddr>) -> Self {
        match identity {
            Some(i) => Who::Identity(i),
            None => Who::Anonymous(peer),
        }
    }

    /// The identity, if any.
    pub fn identity(&self) -> Option<&Identity> {
        match self {
            Who::Identity(i) => Some(i),
            Who::Anonymous(_) => None,
        }
    }

    /// The same caller (identities compared without an early exit).
    pub fn same(&self, other: &Who) -> bool {
        match (self, other) {
            (Who::Identity(a), Who::Identity(b)) => a.matches(b),
            (Who::Anonymous(a), Who::Anonymous(b)) => a == b,
            _ => false,
        }
    }
}
