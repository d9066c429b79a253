//! The listener's dispatch: what reaches a waiter, what is passed on.

use super::*;

#[test]
fn a_waiter_hears_nudges_then_its_grant_and_a_nudge_passes_nothing_on() {
    let orphans = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&orphans);
    let l = Listener::new(
        tokio_postgres::Config::new(),
        Tls::None,
        Box::new(move |o: Orphan| seen.lock().unwrap().push(o.ticket)),
    );
    l.dispatch.lock().up = Some(1);
    let ticket = l.waiter_ticket();
    let mut rx = l.register(ticket).unwrap();
    l.dispatch.deliver(&format!("w {ticket} 1500"));
    l.dispatch.deliver(&format!("w {ticket} 700"));
    l.dispatch.deliver(&format!("{ticket} 42 1 g:k"));
    let free_in = |w| match w {
        Ok(Wake::FreeIn(d)) => Some(d),
        _ => None,
    };
    assert_eq!(free_in(rx.try_recv()), Some(Duration::from_micros(1500)));
    assert_eq!(free_in(rx.try_recv()), Some(Duration::from_micros(700)));
    assert!(matches!(rx.try_recv(), Ok(Wake::Granted(g)) if g.fence == 42));
    // One grant per registration: the sender went with it.
    assert!(matches!(
        rx.try_recv(),
        Err(mpsc::error::TryRecvError::Disconnected)
    ));
    // A nudge for a call that is gone is dropped; a grant is passed on.
    l.unregister(ticket);
    l.dispatch.deliver(&format!("w {ticket} 1500"));
    assert!(orphans.lock().unwrap().is_empty());
    l.dispatch.deliver(&format!("{ticket} 43 1 g:k"));
    assert_eq!(*orphans.lock().unwrap(), vec![ticket]);
}

#[test]
fn channel_is_a_plain_identifier() {
    let l = Listener::new(tokio_postgres::Config::new(), Tls::None, Box::new(drop));
    assert!(l.channel().len() < 63);
    assert!(
        l.channel()
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    );
}
