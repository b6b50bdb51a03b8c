package store

// SetCatalogFullEvery sets how many polls go by between two whole reads of each
// catalog bucket until the returned function restores it.
func SetCatalogFullEvery(n int) (restore func()) {
	old := catalogFullEvery.Swap(int64(n))
	return func() { catalogFullEvery.Store(old) }
}
