"""Plans predicted from data sheets: a GPU cluster's facts (`cluster`), a decoder's shape
(`shape`), every plan of a world size at one global batch (`space`), each priced by
`harness.costs.plan_step` and ranked (`search`), the source of the figures and the error it has
shown (`source`), and the commands that train them (`commands`). `python -m harness.recommend
--plans` and `--predict` print them (docs/planner.md).
"""
