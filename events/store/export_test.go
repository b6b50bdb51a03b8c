package store

// SetCatalogFullEvery sets how many polls go by between two whole reads of each
// catalog bucket until the returned function restores it.
func SetCatalogFullEvery(n int) (restore func()) {
	old := catalogFullEvery
	catalogFullEvery = n
	return func() { catalogFullEvery = old }
}
