//! The memory guard at the model thread's safe points: between steps no expert lease is alive,
//! so the expert cache can shrink (and its pages go back to the OS) when RSS passes the budget
//! or the machine runs short, and grow back once pressure has stayed away
//! (`nectar_residency::rss`). A guard failure (no memory even for one slot per layer) fails the
//! requests of that moment; the server keeps serving.
use nectar_engine::ModelBundle;
use nectar_residency::rss::RssGuard;

/// The guard of one served model (none without a budget: memory-mapped experts are the OS's).
pub(crate) struct MemoryGuard(Option<RssGuard>);

impl MemoryGuard {
    pub(crate) fn new(bundle: &ModelBundle, budget: Option<u64>) -> MemoryGuard {
        MemoryGuard(
            budget
                .filter(|_| bundle.model.residency().is_some())
                .map(RssGuard::new),
        )
    }

    /// Checks at a safe point; `Err` is the error the requests of this moment fail with.
    pub(crate) fn check(&mut self, bundle: &ModelBundle) -> Result<(), nectar_engine::Error> {
        let (Some(g), Some(res)) = (self.0.as_mut(), bundle.model.residency()) else {
            return Ok(());
        };
        g.check(res).map(drop).map_err(|e| {
            tracing::error!(error = %e, "memory guard");
            nectar_engine::Error::Model(e.into())
        })
    }
}
