pub fn run(_a: &crate::cli::BacktestArgs) -> crate::Result<()> {
    Ok(())
}
