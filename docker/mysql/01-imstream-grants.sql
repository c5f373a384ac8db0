-- imstream creates one database per tenant (`imstream migrate`) and the
-- registry's database, so its user needs rights beyond one schema.
GRANT ALL PRIVILEGES ON *.* TO 'imstream'@'%';
FLUSH PRIVILEGES;
