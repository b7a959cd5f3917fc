//! Queues bounded twice: in items and in bytes (design.md §11b, "every queue bounded"). A
//! message may be as large as `upstream.max_event_bytes` (MiBs), so a bound in items alone lets a
//! slow reader hold items × that; here a send also waits while the items queued and unread hold
//! the byte bound (one item always fits, however large). A leaf: it names no other module.

use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::{mpsc, Semaphore};

/// The sending half. Cheap to clone.
#[derive(Debug)]
pub struct Tx<T> {
    tx: mpsc::Sender<(T, u32)>,
    room: Arc<Semaphore>,
    cap: u32,
}

impl<T> Clone for Tx<T> {
    fn clone(&self) -> Self {
        Tx {
            tx: self.tx.clone(),
            room: self.room.clone(),
            cap: self.cap,
        }
    }
}

/// The receiving half: taking an item gives its bytes back.
#[derive(Debug)]
pub struct Rx<T> {
    rx: mpsc::Receiver<(T, u32)>,
    room: Arc<Semaphore>,
}

/// A queue of at most `items` items holding at most `bytes` bytes (counted in KiB).
pub fn bounded<T>(items: usize, bytes: usize) -> (Tx<T>, Rx<T>) {
    let cap = u32::try_from(bytes.div_ceil(1024).max(1)).unwrap_or(u32::MAX >> 3);
    let room = Arc::new(Semaphore::new(cap as usize));
    let (tx, rx) = mpsc::channel(items);
    (
        Tx {
            tx,
            room: room.clone(),
            cap,
        },
        Rx { rx, room },
    )
}

impl<T> Tx<T> {
    /// What `len` bytes count for: their KiB, at most the whole bound (one item always fits).
    fn weight(&self, len: usize) -> u32 {
        u32::try_from(len.div_ceil(1024))
            .unwrap_or(u32::MAX)
            .min(self.cap)
    }

    /// Queues `item` of `len` bytes, waiting for room in items and in bytes. Cancel-safe: a send
    /// dropped before it completes queues nothing and holds no room. `Err` gives the item back
    /// when the receiver is gone.
    pub async fn send(&self, item: T, len: usize) -> Result<(), T> {
        let n = self.weight(len);
        let Ok(permit) = self.room.clone().acquire_many_owned(n).await else {
            return Err(item);
        };
        match self.tx.send((item, n)).await {
            Ok(()) => {
                // The receiver gives the room back when it takes the item.
                permit.forget();
                Ok(())
            }
            Err(e) => Err(e.0 .0),
        }
    }

    /// Queues `items` (`len` bytes in all) together: all of them or, when the send is dropped
    /// before it completes, none (a reader never sees the first without the rest, as it never
    /// sees part of one item). Waits for room for all of them, in items and in bytes; the items
    /// count for `len` as one item would, until the reader has taken the last of them. `Err`
    /// gives the items back when the receiver is gone.
    pub async fn send_all<const N: usize>(&self, items: [T; N], len: usize) -> Result<(), [T; N]> {
        let n = self.weight(len);
        let Ok(permit) = self.room.clone().acquire_many_owned(n).await else {
            return Err(items);
        };
        let Ok(slots) = self.tx.reserve_many(N).await else {
            return Err(items);
        };
        // The last item carries the bytes' room: the reader gives it back once it has taken
        // them all (the others count for nothing).
        permit.forget();
        for (i, (slot, item)) in slots.zip(items).enumerate() {
            slot.send((item, if i + 1 == N { n } else { 0 }));
        }
        Ok(())
    }

    /// Queues `item` of `len` bytes only if there is room now.
    pub fn try_send(&self, item: T, len: usize) -> Result<(), T> {
        let n = self.weight(len);
        let Ok(permit) = self.room.clone().try_acquire_many_owned(n) else {
            return Err(item);
        };
        match self.tx.try_send((item, n)) {
            Ok(()) => {
                permit.forget();
                Ok(())
            }
            Err(e) => Err(e.into_inner().0),
        }
    }

    /// Completes when the receiver is gone.
    pub async fn closed(&self) {
        self.tx.closed().await
    }

    /// Whether the receiver is gone.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

impl<T> Drop for Rx<T> {
    /// A receiver gone gives no room back for what it did not take: its room is closed instead,
    /// so that a send waiting for it (or any later one) fails at once, as a send on a channel
    /// whose receiver is gone does. Without it a stream whose client left while the queue was
    /// full waited forever, holding its session (`tests/adversary19b.rs`).
    fn drop(&mut self) {
        self.room.close();
    }
}

impl<T> Rx<T> {
    /// The next item; `None` once every sender is gone and the queue is empty.
    pub async fn recv(&mut self) -> Option<T> {
        let (item, n) = self.rx.recv().await?;
        self.room.add_permits(n as usize);
        Some(item)
    }

    /// [`Rx::recv`] as a poll (for a response body).
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<T>> {
        self.rx.poll_recv(cx).map(|o| {
            o.map(|(item, n)| {
                self.room.add_permits(n as usize);
                item
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A receiver dropped while the byte bound is full fails the send waiting for room, and
    /// every later one, at once.
    #[tokio::test(start_paused = true)]
    async fn a_send_waiting_for_room_fails_once_the_receiver_is_gone() {
        let (tx, rx) = bounded::<u32>(8, 4096);
        tx.send(1, 4096).await.unwrap();
        let waiting = tokio::spawn({
            let tx = tx.clone();
            async move { tx.send(2, 1024).await }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!waiting.is_finished(), "the bound is full: the send waits");
        drop(rx);
        let r = tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .expect("the waiting send ends")
            .unwrap();
        assert_eq!(r, Err(2));
        assert_eq!(tx.send(3, 1).await, Err(3));
        assert_eq!(tx.try_send(4, 1), Err(4));
    }

    /// A send waits while the unread items hold the byte bound, and goes through once the reader
    /// takes one; one item larger than the bound still passes alone.
    #[tokio::test(start_paused = true)]
    async fn sends_wait_for_room_in_bytes() {
        let (tx, mut rx) = bounded::<Vec<u8>>(100, 4096);
        tx.send(vec![0; 3000], 3000).await.unwrap();
        let blocked = tokio::time::timeout(Duration::from_secs(1), tx.send(vec![1; 2000], 2000));
        assert!(blocked.await.is_err(), "5000 bytes do not fit in 4096");
        assert_eq!(rx.recv().await.unwrap().len(), 3000);
        tx.send(vec![1; 2000], 2000).await.unwrap();
        assert_eq!(rx.recv().await.unwrap().len(), 2000);
        // Larger than the whole bound: alone, it fits.
        tx.send(vec![2; 1 << 20], 1 << 20).await.unwrap();
        assert!(
            tx.try_send(vec![3], 1).is_err(),
            "full while the large one is unread"
        );
        assert_eq!(rx.recv().await.unwrap().len(), 1 << 20);
        assert!(tx.try_send(vec![3], 1).is_ok());
    }

    /// Items sent together arrive together and in order, wait for room for all of them, and a
    /// send of them cancelled while it waits queues none of them.
    #[tokio::test(start_paused = true)]
    async fn items_sent_together_arrive_together_or_not_at_all() {
        let (tx, mut rx) = bounded::<u8>(4, 4096);
        tx.send(1, 10).await.unwrap();
        tx.send(2, 10).await.unwrap();
        // Three slots are needed and two are free: it waits, and is dropped.
        let waiting = tokio::time::timeout(Duration::from_secs(1), tx.send_all([3, 4, 5], 30));
        assert!(
            waiting.await.is_err(),
            "two free slots do not hold three items"
        );
        assert_eq!(rx.recv().await, Some(1));
        tx.send_all([3, 4, 5], 3000).await.unwrap();
        // The bytes are held until the last of them is taken.
        assert!(tx.try_send(6, 2000).is_err(), "3000 + 2000 bytes over 4096");
        for want in [2, 3, 4] {
            assert_eq!(rx.recv().await, Some(want));
            assert!(tx.try_send(6, 2000).is_err(), "held until 5 is taken");
        }
        assert_eq!(rx.recv().await, Some(5));
        assert!(tx.try_send(6, 2000).is_ok());
        assert_eq!(rx.recv().await, Some(6));
        drop(rx);
        assert_eq!(tx.send_all([7, 8], 1).await, Err([7, 8]));
    }

    /// A send cancelled while it waits holds no room afterwards.
    #[tokio::test(start_paused = true)]
    async fn a_cancelled_send_holds_nothing() {
        let (tx, mut rx) = bounded::<u8>(1, 1 << 20);
        tx.send(1, 10).await.unwrap();
        // The item slot is full: this send waits, holding its bytes' room, and is dropped.
        let waiting = tokio::time::timeout(Duration::from_secs(1), tx.send(2, 1 << 20));
        assert!(waiting.await.is_err());
        assert_eq!(rx.recv().await, Some(1));
        // All the room is back: an item of the whole bound fits at once.
        assert!(tx.try_send(3, 1 << 20).is_ok());
    }
}
