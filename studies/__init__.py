"""Research experiments: the SST-5 quality grids and the studies run on them. They answer a question
once, over hours; their figures go to studies/results/ and their resume caches to studies/results/cache/
(not tracked by git). The repeatable measurements are ``bench``; nothing in the product imports either."""
